//! The performance monitor: step time, samples per second, the share of time spent waiting for
//! data, and memory (allocated and peak on a GPU, resident set on the CPU), per logging interval
//! and for the whole run.

use std::time::{Duration, Instant};

use serde::Serialize;
use tch::Device;

/// Memory at one point of a run, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct MemorySample {
    /// GPU: bytes held by tensors now and at the peak since the run began.
    pub gpu_allocated: Option<u64>,
    pub gpu_peak: Option<u64>,
    /// CPU: this process's resident set now and at its peak.
    pub rss: Option<u64>,
    pub rss_peak: Option<u64>,
}

impl MemorySample {
    pub fn read(device: Device) -> Self {
        let (rss, rss_peak) = kiln_device::memory::process_rss().unzip();
        let gpu = match device {
            Device::Cuda(i) => kiln_torch_ext::memory::stats(i).ok(),
            _ => None,
        };
        Self {
            gpu_allocated: gpu.as_ref().map(|s| s.allocated),
            gpu_peak: gpu.as_ref().map(|s| s.allocated_peak),
            rss,
            rss_peak,
        }
    }

    /// The figure that matters on this device, for progress lines: GPU peak, else RSS peak.
    pub fn headline(&self) -> Option<(&'static str, u64)> {
        self.gpu_peak
            .map(|b| ("gpu peak", b))
            .or(self.rss_peak.map(|b| ("rss peak", b)))
    }
}

/// Timing over an interval of steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Throughput {
    pub steps: u64,
    pub samples: u64,
    pub seconds: f64,
    /// Seconds spent waiting for the next batch.
    pub data_wait_seconds: f64,
}

impl Throughput {
    pub fn step_seconds(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            self.seconds / self.steps as f64
        }
    }

    pub fn samples_per_second(&self) -> f64 {
        if self.seconds <= 0.0 {
            0.0
        } else {
            self.samples as f64 / self.seconds
        }
    }

    /// Share of the time spent waiting for data, in [0, 1].
    pub fn data_wait_share(&self) -> f64 {
        if self.seconds <= 0.0 {
            0.0
        } else {
            (self.data_wait_seconds / self.seconds).clamp(0.0, 1.0)
        }
    }

    fn add(&mut self, other: &Throughput) {
        self.steps += other.steps;
        self.samples += other.samples;
        self.seconds += other.seconds;
        self.data_wait_seconds += other.data_wait_seconds;
    }
}

/// Accumulates step timings; [`PerfMonitor::take_interval`] hands out and restarts the current
/// interval, while the run totals keep growing.
#[derive(Debug)]
pub struct PerfMonitor {
    interval: Throughput,
    total: Throughput,
    step_start: Option<Instant>,
}

impl Default for PerfMonitor {
    fn default() -> Self {
        Self::new()
    }
}

impl PerfMonitor {
    pub fn new() -> Self {
        Self {
            interval: Throughput::default(),
            total: Throughput::default(),
            step_start: None,
        }
    }

    /// Marks the start of a step (before waiting for its data).
    pub fn start_step(&mut self) {
        self.step_start = Some(Instant::now());
    }

    /// Records time spent waiting for data within the current step.
    pub fn data_wait(&mut self, waited: Duration) {
        self.interval.data_wait_seconds += waited.as_secs_f64();
    }

    /// Marks the end of a step of `samples` samples.
    pub fn end_step(&mut self, samples: u64) {
        if let Some(start) = self.step_start.take() {
            self.interval.seconds += start.elapsed().as_secs_f64();
        }
        self.interval.steps += 1;
        self.interval.samples += samples;
    }

    /// The interval so far, which then starts again.
    pub fn take_interval(&mut self) -> Throughput {
        let interval = std::mem::take(&mut self.interval);
        self.total.add(&interval);
        interval
    }

    /// Everything recorded so far, including the open interval.
    pub fn total(&self) -> Throughput {
        let mut t = self.total;
        t.add(&self.interval);
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_roll_into_totals() {
        let mut m = PerfMonitor::new();
        for _ in 0..3 {
            m.start_step();
            m.data_wait(Duration::from_millis(1));
            m.end_step(32);
        }
        let i = m.take_interval();
        assert_eq!((i.steps, i.samples), (3, 96));
        assert!((i.data_wait_seconds - 0.003).abs() < 1e-9);
        m.start_step();
        m.end_step(16);
        let t = m.total();
        assert_eq!((t.steps, t.samples), (4, 112));
        assert_eq!(m.take_interval().steps, 1);
        assert_eq!(m.total().steps, 4, "taking an interval does not lose it");
        let manual = Throughput {
            steps: 2,
            samples: 10,
            seconds: 2.0,
            data_wait_seconds: 0.5,
        };
        assert_eq!(manual.step_seconds(), 1.0);
        assert_eq!(manual.samples_per_second(), 5.0);
        assert_eq!(manual.data_wait_share(), 0.25);
        assert_eq!(Throughput::default().samples_per_second(), 0.0);
    }

    #[test]
    fn cpu_memory_is_the_resident_set() {
        let m = MemorySample::read(Device::Cpu);
        assert!(m.gpu_allocated.is_none());
        if cfg!(target_os = "linux") {
            assert!(m.rss.unwrap() > 0);
            assert_eq!(m.headline().unwrap().0, "rss peak");
        }
    }
}
