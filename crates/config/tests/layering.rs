//! Layering, provenance and every configuration error, with figment::Jail for files and
//! environment, on simulated machines (so the results do not depend on this machine).
#![allow(
    clippy::result_large_err,
    reason = "figment::Jail fixes the closure's error type"
)]

use figment::Jail;
use kiln_config::{ConfigError, ConfigRequest, Layer, Machine, load, simulated_machine};
use kiln_core::settings::{AmpDtype, MatmulPrecision};
use kiln_core::{ComputeCapability, CpuFacts, Device};
use kiln_profiles::ProfileSet;

fn cpu(cores: usize, bf16: bool) -> CpuFacts {
    CpuFacts {
        model: "test".into(),
        physical_cores: cores,
        logical_cores: cores,
        total_memory_bytes: 64 << 30,
        available_memory_bytes: 60 << 30,
        avx512: bf16,
        avx512_bf16: bf16,
        amx_bf16: bf16,
    }
}

fn machine(gpu: Option<&str>, cores: usize) -> Machine {
    let set = ProfileSet::builtin().unwrap();
    Machine::Simulated(simulated_machine(&set, gpu, None, None, None, cpu(cores, true)).unwrap())
}

fn request(gpu: Option<&str>, cores: usize) -> ConfigRequest {
    ConfigRequest::new(machine(gpu, cores))
}

fn jail_err(e: ConfigError) -> figment::Error {
    figment::Error::from(e.to_string())
}

#[test]
fn the_profile_fills_what_the_user_did_not_set() {
    Jail::expect_with(|_jail| {
        let r = load(&request(Some("NVIDIA H100 80GB HBM3"), 64)).map_err(jail_err)?;
        assert_eq!(r.selection.device, Device::Cuda(0));
        assert_eq!(r.profile.profile.name, "h100");
        let plan = &r.plan;
        assert_eq!(plan.train.batch_size, 256);
        assert_eq!(plan.infer.batch_size, 1024);
        assert_eq!(plan.infer.sliding_window.batch_size, 16);
        let src = plan.source_of("infer.sliding_window.batch_size").unwrap();
        assert_eq!(src.layer, Layer::Profile);
        assert_eq!(plan.data.num_workers, 32);
        assert_eq!(plan.train.amp, AmpDtype::Bf16);
        assert_eq!(
            plan.performance.backend.matmul_precision,
            MatmulPrecision::High
        );
        let src = plan.source_of("train.batch_size").unwrap();
        assert_eq!(src.layer, Layer::Profile);
        assert_eq!(src.source, "profile h100 (built-in profiles/h100.toml)");
        assert_eq!(
            plan.source_of("train.epochs").unwrap().layer,
            Layer::Default
        );
        let builtin = kiln_config::ModelPlan::builtin(kiln_config::ModelKind::Transformer);
        assert_eq!(
            plan.model,
            kiln_config::ModelPlan {
                dropout: 0.1,
                ..builtin
            }
        );
        Ok(())
    });
}

#[test]
fn the_user_wins_in_every_layer_even_with_the_default_value() {
    Jail::expect_with(|jail| {
        // 32 is also the built-in default: the seed's "override only if == 32" bug must not
        // come back. The file says 32, so 32 it is, over the profile's 256.
        jail.create_file("kiln.toml", "[train]\nbatch_size = 32\nlr = 0.01\n")?;
        let mut req = request(Some("NVIDIA H100 80GB HBM3"), 64);
        req.file = Some("kiln.toml".into());
        let r = load(&req).map_err(jail_err)?;
        assert_eq!(r.plan.train.batch_size, 32);
        let src = r.plan.source_of("train.batch_size").unwrap();
        assert_eq!(src.layer, Layer::File);
        assert!(
            src.source.ends_with("kiln.toml") && src.source.starts_with("TOML file"),
            "{}",
            src.source
        );

        // Environment over the file; numbers from the environment may be strings ("5e-4").
        jail.set_env("KILN_TRAIN__BATCH_SIZE", "48");
        jail.set_env("KILN_TRAIN__LR", "5e-4");
        let r = load(&req).map_err(jail_err)?;
        assert_eq!(r.plan.train.batch_size, 48);
        assert_eq!(r.plan.train.lr, 5e-4);
        let src = r.plan.source_of("train.lr").unwrap();
        assert_eq!(src.layer, Layer::Env);
        assert_eq!(src.source, "environment variable KILN_TRAIN__LR");

        // Command line over everything; a later --set wins over an earlier one, flags last.
        req.sets = vec!["train.batch_size=8".into(), "train.batch_size=16".into()];
        let r = load(&req).map_err(jail_err)?;
        assert_eq!(r.plan.train.batch_size, 16);
        assert_eq!(
            r.plan.source_of("train.batch_size").unwrap().source,
            "command line (--set train.batch_size=16)"
        );
        req.flags = vec![(
            "--batch-size".into(),
            "train.batch_size".into(),
            "24".into(),
        )];
        let r = load(&req).map_err(jail_err)?;
        assert_eq!(r.plan.train.batch_size, 24);
        assert_eq!(
            r.plan.source_of("train.batch_size").unwrap().source,
            "command line (--batch-size)"
        );
        Ok(())
    });
}

#[test]
fn unrelated_kiln_environment_variables_are_not_config_keys() {
    Jail::expect_with(|jail| {
        jail.set_env("KILN_CACHE_DIR", "/tmp/x");
        jail.set_env("KILN_PYTHON", "python3.12");
        load(&request(None, 2)).map_err(jail_err)?;
        Ok(())
    });
}

#[test]
fn yaml_and_json_files_work_too() {
    Jail::expect_with(|jail| {
        jail.create_file("k.yaml", "train:\n  epochs: 3\n")?;
        jail.create_file("k.json", "{\"train\": {\"epochs\": 4}}")?;
        for (file, epochs) in [("k.yaml", 3), ("k.json", 4)] {
            let mut req = request(None, 2);
            req.file = Some(file.into());
            let r = load(&req).map_err(jail_err)?;
            assert_eq!(r.plan.train.epochs, epochs, "{file}");
            assert_eq!(r.plan.source_of("train.epochs").unwrap().layer, Layer::File);
        }
        Ok(())
    });
}

#[test]
fn device_request_in_config_selects_the_device_and_its_profile() {
    Jail::expect_with(|jail| {
        jail.set_env("KILN_DEVICE__REQUEST", "cpu");
        let r = load(&request(Some("NVIDIA A100-SXM4-80GB"), 2)).map_err(jail_err)?;
        assert_eq!(r.selection.device, Device::Cpu);
        assert_eq!(r.profile.profile.name, "generic-cpu");
        assert_eq!(r.plan.train.batch_size, 16);
        // The CPU has AMX: bf16, with the reason attached to the value's provenance.
        assert_eq!(r.plan.train.amp, AmpDtype::Bf16);
        let note = r.plan.source_of("train.amp").unwrap().note.clone().unwrap();
        assert!(
            note.contains("profile said fp32; the CPU has AMX-BF16"),
            "{note}"
        );
        assert_eq!(r.plan.data.num_workers, 2, "capped at the 2 cores");
        // The profile's count is the ceiling of the default `auto`; a number is taken as it is.
        assert!(r.plan.data.num_workers_auto);
        jail.set_env("KILN_DATA__NUM_WORKERS", "0");
        let plan = load(&request(None, 2)).map_err(jail_err)?.plan;
        assert_eq!(
            (plan.data.num_workers, plan.data.num_workers_auto),
            (0, false)
        );
        Ok(())
    });
}

/// A number given to an optional text key is its text: `model.output = 1` (an index into a
/// program's tuple) on the command line or in a file, `model.quantiles = 0.5` (one level).
#[test]
fn numbers_given_to_text_keys_are_their_text() {
    Jail::expect_with(|jail| {
        jail.create_file("kiln.toml", "[model]\nquantiles = 0.5\n")?;
        let mut req = request(None, 8);
        req.file = Some("kiln.toml".into());
        req.sets = vec!["model.output=1".to_owned()];
        let plan = load(&req).map_err(jail_err)?.plan;
        assert_eq!(plan.model.output.as_deref(), Some("1"));
        assert_eq!(plan.model.quantiles, Some(vec![0.5]));
        req.sets.push("model.quantiles=0.9,0.1".to_owned());
        let err = load(&req).unwrap_err().to_string();
        assert!(
            err.contains("`model.quantiles`") && err.contains("rising"),
            "{err}"
        );
        Ok(())
    });
}

/// A nested section (`infer.sliding_window`) is set in every layer like any other, each value
/// with its provenance, and errors name the whole key.
#[test]
fn nested_keys_are_set_in_every_layer_and_named_in_errors() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "kiln.toml",
            "[model]\nquantiles = [0.1, 0.5, 0.9]\n[infer.sliding_window]\nmode = \"gaussian\"\n",
        )?;
        jail.set_env("KILN_INFER__SLIDING_WINDOW__OVERLAP", "0.5");
        let mut req = request(None, 8);
        req.file = Some("kiln.toml".into());
        req.sets = vec!["infer.sliding_window.roi=64,64,32".to_owned()];
        let r = load(&req).map_err(jail_err)?;
        let w = &r.plan.infer.sliding_window;
        assert_eq!(w.roi, [64, 64, 32]);
        assert_eq!(w.overlap, 0.5);
        assert_eq!(w.mode, kiln_config::BlendMode::Gaussian);
        assert_eq!(w.batch_size, 4, "the default");
        assert_eq!(
            r.plan.model.quantiles,
            Some(vec![0.1, 0.5, 0.9]),
            "a TOML list"
        );
        let source = |k: &str| r.plan.source_of(k).map(|p| p.source.clone()).unwrap();
        assert!(source("infer.sliding_window.mode").contains("kiln.toml"));
        assert!(
            source("infer.sliding_window.overlap").contains("KILN_INFER__SLIDING_WINDOW__OVERLAP")
        );
        assert!(source("infer.sliding_window.roi").contains("--set"));
        req.sets.push("infer.sliding_window.overlap=1".to_owned());
        let err = load(&req).unwrap_err().to_string();
        assert!(
            err.contains("`infer.sliding_window.overlap`") && err.contains("[0, 1)"),
            "{err}"
        );
        req.sets = vec!["infer.sliding_window.roi=big".to_owned()];
        let err = load(&req).unwrap_err().to_string();
        assert!(err.contains("`infer.sliding_window.roi`"), "{err}");
        req.sets = vec!["infer.sliding_window.size=3".to_owned()];
        let err = load(&req).unwrap_err().to_string();
        assert!(err.contains("size"), "{err}");
        Ok(())
    });
}

#[test]
fn a_profile_can_be_named_instead_of_matched() {
    Jail::expect_with(|jail| {
        jail.set_env("KILN_DEVICE__PROFILE", "l4");
        let r = load(&request(Some("NVIDIA A100-SXM4-80GB"), 64)).map_err(jail_err)?;
        assert_eq!(r.profile.profile.name, "l4");
        assert_eq!(r.plan.train.batch_size, 32);
        Ok(())
    });
}

#[test]
fn unknown_keys_are_rejected_with_did_you_mean_and_the_layer() {
    Jail::expect_with(|jail| {
        jail.create_file("kiln.toml", "[performance]\ntf23 = true\n")?;
        let mut req = request(None, 2);
        req.file = Some("kiln.toml".into());
        let err = load(&req).unwrap_err().to_string();
        assert!(err.contains("unknown key `performance.tf23`"), "{err}");
        assert!(err.contains("kiln.toml"), "{err}");
        assert!(err.contains("did you mean `performance.tf32`?"), "{err}");
        assert!(err.contains("valid keys here: performance.tf32, "), "{err}");

        let mut req = request(None, 2);
        req.sets = vec!["trian.batch_size=3".into()];
        let err = load(&req).unwrap_err().to_string();
        assert!(err.contains("unknown key `trian`"), "{err}");
        assert!(
            err.contains("command line (--set trian.batch_size=3)"),
            "{err}"
        );
        Ok(())
    });
}

#[test]
fn bad_values_name_the_key_the_value_what_is_valid_and_the_layer() {
    Jail::expect_with(|jail| {
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "KILN_TRAIN__BATCH_SIZE",
                "0",
                &[
                    "`train.batch_size` = 0",
                    "must be at least 1",
                    "environment variable KILN_TRAIN__BATCH_SIZE",
                ],
            ),
            (
                "KILN_PERFORMANCE__MEMORY_FRACTION",
                "1.5",
                &["`performance.memory_fraction` = 1.5", "must be in (0, 1]"],
            ),
            (
                "KILN_TRAIN__AMP",
                "fp8",
                &["`train.amp`", "fp32, fp16 or bf16"],
            ),
            (
                "KILN_PERFORMANCE__MATMUL_PRECISION",
                "low",
                &["highest, high or medium"],
            ),
            (
                "KILN_PERFORMANCE__DETERMINISTIC",
                "maybe",
                &["use off, warn or error"],
            ),
            (
                "KILN_DEVICE__REQUEST",
                "tpu",
                &[
                    "`device.request`",
                    "auto, cpu, cuda, cuda:N, mps",
                    "KILN_DEVICE__REQUEST",
                ],
            ),
            (
                "KILN_TRAIN__LR",
                "fast",
                &["train.lr", "a number > 0, or \"auto\""],
            ),
            (
                "KILN_INFER__CUDA_GRAPHS",
                "sometimes",
                &["`infer.cuda_graphs`", "use auto, on or off"],
            ),
            (
                "KILN_SERVE__HOST",
                "localhost:80",
                &["`serve.host`", "must be an IP address"],
            ),
            (
                "KILN_SERVE__PORT",
                "70000",
                &["`serve.port` = 70000", "0 to 65535"],
            ),
            (
                "KILN_SERVE__MAX_WAIT_MS",
                "-1",
                &["`serve.max_wait_ms`", "[0, 10000] milliseconds"],
            ),
            (
                "KILN_DATA__NUM_WORKERS",
                "many",
                &["`data.num_workers`", "a whole number", "\"auto\""],
            ),
        ];
        for (var, value, wanted) in cases {
            jail.clear_env();
            jail.set_env(var, value);
            let err = load(&request(None, 2)).unwrap_err().to_string();
            for w in *wanted {
                assert!(err.contains(w), "{var}={value}: expected `{w}` in: {err}");
            }
        }
        jail.clear_env();
        jail.set_env("KILN_DEVICE__REQUEST", "cuda:3");
        let err = load(&request(Some("NVIDIA H100 80GB HBM3"), 8))
            .unwrap_err()
            .to_string();
        assert!(err.contains("device `cuda:3` is not available"), "{err}");
        assert!(err.contains("cuda:0 (NVIDIA H100 80GB HBM3)"), "{err}");
        Ok(())
    });
}

#[test]
fn file_and_set_errors_name_the_file_or_argument() {
    Jail::expect_with(|jail| {
        let mut req = request(None, 2);
        req.file = Some("missing.toml".into());
        let err = load(&req).unwrap_err().to_string();
        assert_eq!(err, "config file missing.toml: no such file");

        jail.create_file("kiln.ini", "x=1")?;
        req.file = Some("kiln.ini".into());
        assert!(
            load(&req)
                .unwrap_err()
                .to_string()
                .contains("use a .toml, .yaml/.yml or .json")
        );

        jail.create_file("broken.toml", "[train\nbatch_size = ")?;
        req.file = Some("broken.toml".into());
        let err = load(&req).unwrap_err().to_string();
        assert!(err.contains("broken.toml"), "{err}");

        let mut req = request(None, 2);
        req.sets = vec!["batch_size".into()];
        assert_eq!(
            load(&req).unwrap_err().to_string(),
            "--set batch_size: expected section.key=value"
        );
        req.sets = vec!["batch_size=3".into()];
        assert!(
            load(&req)
                .unwrap_err()
                .to_string()
                .contains("not of the form section.key")
        );
        Ok(())
    });
}

#[test]
fn simulated_gpus_need_facts_only_when_no_profile_knows_them() {
    let set = ProfileSet::builtin().unwrap();
    let m = simulated_machine(
        &set,
        Some("NVIDIA H200"),
        None,
        None,
        Some(8),
        cpu(2, false),
    )
    .unwrap();
    assert_eq!(m.gpus[0].compute_capability, ComputeCapability::new(9, 0));
    assert_eq!(m.cpu.logical_cores, 8);
    let err =
        simulated_machine(&set, Some("NVIDIA A40"), None, None, None, cpu(2, false)).unwrap_err();
    assert!(err.to_string().contains("add --memory-gib N"), "{err}");
    let m = simulated_machine(
        &set,
        Some("NVIDIA A40"),
        Some(48.0),
        Some(ComputeCapability::new(8, 6)),
        None,
        cpu(2, false),
    )
    .unwrap();
    assert_eq!(m.gpus[0].memory_gib(), 48.0);
}

#[test]
fn a_checkpoint_layer_sits_over_the_profile_and_under_the_user() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        let mut req = request(None, 4);
        req.checkpoint = Some((
            "runs/a/checkpoints/step-000000010".to_owned(),
            vec![
                ("model.name".to_owned(), "transformer".to_owned()),
                ("model.layers".to_owned(), "3".to_owned()),
                ("model.hidden".to_owned(), "32,16".to_owned()),
            ],
        ));
        req.sets = vec!["model.layers=5".to_owned()];
        let plan = load(&req).map_err(jail_err)?.plan;
        assert_eq!(plan.model.kind, kiln_config::ModelKind::Transformer);
        assert_eq!(plan.model.hidden, vec![32, 16]);
        assert_eq!(plan.model.layers, 5, "the user wins over the checkpoint");
        let src = plan.source_of("model.name").unwrap();
        assert_eq!(src.layer, Layer::Checkpoint);
        assert_eq!(src.source, "checkpoint runs/a/checkpoints/step-000000010");
        assert_eq!(
            plan.source_of("model.layers").unwrap().layer,
            Layer::CommandLine
        );
        Ok(())
    });
}

#[test]
fn cuda_graphs_on_refuses_what_cannot_be_one_graph_naming_the_clashing_key() {
    // In a jail: other tests set KILN_* variables while they run.
    Jail::expect_with(|_| {
        let cases: &[(&[&str], &[&str])] = &[
            (
                &["train.amp=fp16"],
                &[
                    "`train.amp` = fp16",
                    "bf16 or fp32",
                    "train.cuda_graphs = on",
                ],
            ),
            (
                &["train.optimizer=sgd"],
                &["`train.optimizer` = sgd", "adamw"],
            ),
            (
                &["train.grad_accum_steps=4"],
                &["`train.grad_accum_steps`", "1: a step of several"],
            ),
        ];
        for (sets, expected) in cases {
            let mut req = request(None, 8);
            req.sets = sets.iter().map(|s| (*s).to_owned()).collect();
            req.sets.push("train.cuda_graphs=on".to_owned());
            let err = load(&req).unwrap_err().to_string();
            for e in *expected {
                assert!(err.contains(e), "{sets:?}: `{e}` not in: {err}");
            }
            // `auto` leaves the step eager where it cannot apply, without an error.
            let mut auto = request(None, 8);
            auto.sets = sets.iter().map(|s| (*s).to_owned()).collect();
            auto.sets.push("train.cuda_graphs=auto".to_owned());
            let plan = load(&auto).map_err(jail_err)?.plan;
            assert_eq!(plan.train.cuda_graphs, kiln_config::CudaGraphs::Auto);
        }
        Ok(())
    });
}

#[test]
fn keep_best_takes_a_flag_or_a_metric_from_one_vocabulary() {
    use kiln_config::{KeepBest, MetricName};
    // In a jail: other tests set KILN_* variables while they run.
    Jail::expect_with(|jail| {
        let cases = [
            ("true", KeepBest::TaskDefault),
            ("false", KeepBest::Off),
            ("val_mae", KeepBest::By(MetricName::Mae)),
            ("loss", KeepBest::By(MetricName::Loss)),
        ];
        for (value, expected) in cases {
            let mut req = request(None, 8);
            req.sets = vec![format!("checkpoint.keep_best={value}")];
            let plan = load(&req).map_err(jail_err)?.plan;
            assert_eq!(plan.checkpoint.keep_best, expected, "{value}");
        }
        // The default: the task's own metric, as `keep_best = true` always meant.
        let plan = load(&request(None, 8)).map_err(jail_err)?.plan;
        assert_eq!(plan.checkpoint.keep_best, KeepBest::TaskDefault);
        let mut req = request(None, 8);
        req.sets = vec!["checkpoint.keep_best=f1".to_owned()];
        let err = load(&req).unwrap_err().to_string();
        for e in [
            "`checkpoint.keep_best`",
            "\"f1\"",
            "val_loss, val_accuracy, val_mae, val_rmse",
        ] {
            assert!(err.contains(e), "`{e}` not in: {err}");
        }
        jail.create_file("kiln.toml", "[checkpoint]\nkeep_best = false\n")?;
        let mut req = request(None, 8);
        req.file = Some("kiln.toml".into());
        let plan = load(&req).map_err(jail_err)?.plan;
        assert_eq!(plan.checkpoint.keep_best, KeepBest::Off);
        Ok(())
    });
}

#[test]
fn a_built_in_model_brings_its_own_defaults_named_and_below_everything_the_user_sets() {
    Jail::expect_with(|jail| {
        let mut req = request(None, 8);
        req.sets = vec!["model.name=unet3d".into()];
        let plan = load(&req).map_err(jail_err)?.plan;
        assert_eq!(plan.model.channels, [16, 32, 64]);
        assert_eq!((plan.data.synthetic_samples, plan.train.epochs), (512, 3));
        let src = plan.source_of("model.channels").unwrap();
        assert_eq!(src.layer, Layer::Default);
        assert_eq!(src.source, "kiln's built-in defaults for the unet3d model");
        // The profile still fills its keys; the key table's defaults stay for the rest.
        assert_eq!(
            plan.source_of("train.batch_size").unwrap().layer,
            Layer::Profile
        );
        assert_eq!(plan.source_of("train.lr").unwrap().layer, Layer::Default);
        // The user wins over the model's defaults in every layer, even naming the model in a file.
        jail.create_file(
            "kiln.toml",
            "[model]\nname = \"unet3d\"\n[train]\nepochs = 7\n",
        )?;
        let mut req = request(None, 8);
        req.file = Some("kiln.toml".into());
        req.sets = vec!["model.channels=8,16".into()];
        let plan = load(&req).map_err(jail_err)?.plan;
        assert_eq!(plan.model.channels, [8, 16]);
        assert_eq!((plan.train.epochs, plan.data.synthetic_samples), (7, 512));
        // Other models keep the key table's defaults.
        let mut req = request(None, 8);
        req.sets = vec!["model.name=convnet".into()];
        let plan = load(&req).map_err(jail_err)?.plan;
        assert_eq!(plan.model.channels, [32, 64, 128]);
        assert_eq!(
            plan.source_of("model.channels").unwrap().source,
            "kiln's built-in defaults"
        );
        Ok(())
    });
}

#[test]
fn lr_auto_keeps_the_default_as_its_fallback_and_explains_itself() {
    Jail::expect_with(|jail| {
        jail.set_env("KILN_TRAIN__LR", "auto");
        let plan = load(&request(None, 4)).map_err(jail_err)?.plan;
        assert!(plan.train.lr_auto);
        assert_eq!(plan.train.lr, 1e-3);
        let shown = plan
            .entries()
            .into_iter()
            .find(|(k, _)| *k == "train.lr")
            .map(|(_, v)| v);
        assert_eq!(
            shown.as_deref(),
            Some("auto (a range test before training; 0.001 until then)")
        );
        jail.set_env("KILN_TRAIN__LR", "5e-4");
        let plan = load(&request(None, 4)).map_err(jail_err)?.plan;
        assert!(!plan.train.lr_auto);
        assert_eq!(plan.train.lr, 5e-4);
        for bad in ["0", "-1", "automatic"] {
            jail.set_env("KILN_TRAIN__LR", bad);
            let err = load(&request(None, 4)).unwrap_err().to_string();
            assert!(
                err.contains("train.lr") && err.contains("\"auto\""),
                "{err}"
            );
        }
        Ok(())
    });
}
