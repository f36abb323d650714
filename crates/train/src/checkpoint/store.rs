//! A run's `checkpoints/` directory as a whole: its checkpoints in order, the newest good one to
//! resume from, pruning, and moving damaged or superseded checkpoints aside. Only pruning by
//! `keep_last`/`keep_best` deletes a checkpoint; a damaged one is renamed
//! `step-<N>.damaged-<time>` (with a note of why inside), so it is never taken for a checkpoint
//! again, never counted by `keep_last`/`keep_best`, and stays for inspection.

use std::fs::DirEntry;
use std::path::{Path, PathBuf};

use super::{
    Checkpoint, META_FILE, Retention, TMP_PREFIX, check_quick, file_error, load, sync_dir,
};
use crate::TrainError;
use crate::rundir::timestamp_now;

/// The note a moved-aside checkpoint directory gets, saying why it was moved.
pub const MOVED_NOTE: &str = "kiln-moved-aside.txt";

/// The complete checkpoints in `checkpoints`, oldest first: directories named `step-<N>` alone
/// (temporary directories of interrupted writes and moved-aside checkpoints are not checkpoints).
pub fn list(checkpoints: &Path) -> Result<Vec<(u64, PathBuf)>, TrainError> {
    let mut out: Vec<(u64, PathBuf)> = entries(checkpoints)?
        .into_iter()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let digits = name.strip_prefix("step-")?;
            if !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            Some((digits.parse().ok()?, e.path()))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// The entries of the directory `checkpoints`; none if it does not exist (yet).
fn entries(checkpoints: &Path) -> Result<Vec<DirEntry>, TrainError> {
    match std::fs::read_dir(checkpoints) {
        Ok(e) => Ok(e.flatten().collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
        Err(e) => Err(file_error(checkpoints, e)),
    }
}

/// The newest checkpoint that verifies, with the damaged ones passed over on the way and why.
pub fn latest_good(checkpoints: &Path) -> Result<(Checkpoint, Vec<(PathBuf, String)>), TrainError> {
    newest_good(checkpoints, u64::MAX, vec![])
}

/// The newest checkpoint older than step `below` that verifies; `skipped` (what was passed over
/// already) grows with each damaged one. Any other fault (a newer format, a file the process may
/// not read) stops the search: falling back past it would hide it.
fn newest_good(
    checkpoints: &Path,
    below: u64,
    mut skipped: Vec<(PathBuf, String)>,
) -> Result<(Checkpoint, Vec<(PathBuf, String)>), TrainError> {
    for (_, dir) in list(checkpoints)?
        .into_iter()
        .rev()
        .filter(|(step, _)| *step < below)
    {
        match load(&dir) {
            Ok(c) => return Ok((c, skipped)),
            Err(e @ TrainError::DamagedCheckpoint { .. }) => skipped.push((dir, e.to_string())),
            Err(e) => return Err(e),
        }
    }
    if skipped.is_empty() {
        return Err(file_error(checkpoints, "no checkpoint here to resume from"));
    }
    let each: String = skipped
        .iter()
        .map(|(_, why)| format!("\n  {why}"))
        .collect();
    Err(file_error(
        checkpoints,
        format!(
            "no checkpoint here can be resumed: all {} are damaged (left as they are):{each}\n\
             Start a new run without --resume, or resume another run with --resume PATH",
            skipped.len()
        ),
    ))
}

/// Resolves `--resume PATH`: a checkpoint directory (or, if it is damaged, the newest good one
/// before it), or a run directory (its newest good checkpoint). Returns the damaged checkpoints
/// passed over, with why.
pub fn resolve(path: &Path) -> Result<(Checkpoint, Vec<(PathBuf, String)>), TrainError> {
    if path.join(META_FILE).exists() {
        return match load(path) {
            Ok(c) => Ok((c, vec![])),
            Err(e @ TrainError::DamagedCheckpoint { .. }) => {
                let step = path
                    .file_name()
                    .and_then(|n| n.to_str()?.strip_prefix("step-")?.parse::<u64>().ok());
                match (step, path.parent()) {
                    (Some(step), Some(parent)) => {
                        newest_good(parent, step, vec![(path.to_owned(), e.to_string())])
                    }
                    _ => Err(e),
                }
            }
            Err(e) => Err(e),
        };
    }
    let checkpoints = path.join("checkpoints");
    if checkpoints.is_dir() {
        return latest_good(&checkpoints);
    }
    if path.file_name().is_some_and(|n| n == "checkpoints") {
        return latest_good(path);
    }
    Err(file_error(
        path,
        "neither a checkpoint (no checkpoint.json) nor a run directory (no checkpoints/)",
    ))
}

/// A checkpoint directory moved aside: where it was, where it is now, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedAside {
    pub from: PathBuf,
    pub to: PathBuf,
    pub why: String,
}

/// Renames the checkpoint directory `dir` to `<name>.<label>-<UTC time>` beside it (`-2`, `-3`…
/// if that exists), writes `why` into it as [`MOVED_NOTE`], says so in one warning line, and
/// returns where it went. Nothing in it is deleted or changed.
pub fn move_aside(dir: &Path, label: &str, why: &str) -> Result<MovedAside, TrainError> {
    let parent = dir
        .parent()
        .ok_or_else(|| file_error(dir, "a checkpoint directory must have a parent"))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| file_error(dir, "not a checkpoint directory"))?;
    let base = format!("{name}.{label}-{}", timestamp_now());
    let mut to = parent.join(&base);
    let mut n = 1;
    while to.exists() {
        n += 1;
        to = parent.join(format!("{base}-{n}"));
    }
    std::fs::rename(dir, &to).map_err(|e| file_error(dir, format!("cannot move aside: {e}")))?;
    sync_dir(parent)?;
    // The note helps whoever inspects the directory; the rename above is what matters, so a
    // note that cannot be written (a full disk) is logged, not fatal.
    let note = format!("kiln moved this checkpoint aside ({label}): {why}\n");
    if let Err(e) = std::fs::write(to.join(MOVED_NOTE), note) {
        tracing::warn!("{}: cannot write {MOVED_NOTE}: {e}", to.display());
    }
    tracing::warn!(
        "checkpoint {} moved aside ({label}) to {}: {why}",
        dir.display(),
        to.display()
    );
    Ok(MovedAside {
        from: dir.to_owned(),
        to,
        why: why.to_owned(),
    })
}

/// Readies `checkpoints` for a run continuing from step `step`: removes what killed writes and
/// prunes left (`.tmp-…` directories; they never were checkpoints), then moves every checkpoint
/// newer than `step` aside, as `damaged` if its quick check fails, else as `superseded` (the run
/// writes those steps again, and kiln overwrites nothing). Only for a run that owns the
/// directory: a live writer's temporary directory would go too.
pub fn prepare_to_continue(checkpoints: &Path, step: u64) -> Result<Vec<MovedAside>, TrainError> {
    for entry in entries(checkpoints)? {
        if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
            let path = entry.path();
            std::fs::remove_dir_all(&path).map_err(|e| file_error(&path, e))?;
            tracing::info!("removed {}, left by an interrupted write", path.display());
        }
    }
    let mut moved = vec![];
    for (_, dir) in list(checkpoints)?.into_iter().filter(|(s, _)| *s > step) {
        let (label, why) = match check_quick(&dir) {
            Ok(_) => (
                "superseded",
                format!("newer than step {step}, which the run continued from"),
            ),
            Err(e @ TrainError::DamagedCheckpoint { .. }) => ("damaged", e.to_string()),
            Err(e) => return Err(e),
        };
        moved.push(move_aside(&dir, label, &why)?);
    }
    Ok(moved)
}

/// What [`prune`] did: the checkpoints it removed, and the damaged ones it moved aside.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    pub removed: Vec<PathBuf>,
    pub moved: Vec<MovedAside>,
}

/// Removes the good checkpoints `retention` does not keep (the newest `keep_last`, and the
/// best by its metric). Every checkpoint gets the quick check ([`check_quick`]) first: a
/// damaged one is moved aside (not removed, not counted).
pub fn prune(checkpoints: &Path, retention: &Retention) -> Result<Pruned, TrainError> {
    let mut pruned = Pruned::default();
    let mut good = vec![];
    for (_, dir) in list(checkpoints)? {
        match check_quick(&dir) {
            Ok(meta) => good.push((dir, meta)),
            Err(e @ TrainError::DamagedCheckpoint { .. }) => {
                pruned
                    .moved
                    .push(move_aside(&dir, "damaged", &e.to_string())?);
            }
            Err(e) => return Err(e),
        }
    }
    for dir in retention.to_remove(&good) {
        remove_checkpoint(dir)?;
        pruned.removed.push(dir.to_owned());
    }
    Ok(pruned)
}

/// Removes a checkpoint directory so that a crash midway leaves no half-removed checkpoint: it
/// is renamed to a temporary name first (which [`prepare_to_continue`] clears after a crash).
fn remove_checkpoint(dir: &Path) -> Result<(), TrainError> {
    let name = dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let doomed = dir.with_file_name(format!("{TMP_PREFIX}pruned-{name}-{}", std::process::id()));
    std::fs::rename(dir, &doomed).map_err(|e| file_error(dir, e))?;
    std::fs::remove_dir_all(&doomed).map_err(|e| file_error(&doomed, e))
}
