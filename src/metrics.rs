//! Where `log_scalar` writes: a TensorBoard event file in the run's log folder, created at the
//! first value logged, written by one process of a distributed run only.

use crate::tfevents::EventWriter;
use lang::interp::ScalarLog;
use std::path::{Path, PathBuf};

/// The log folder of a program when `--logdir` is not given: `runs/<file stem>` in the working
/// directory (PyTorch's `runs/` convention), so `msl run train.msl` logs to `runs/train/`.
pub fn default_logdir(file: &Path) -> PathBuf {
    let stem = file.file_stem().map_or_else(|| "program".into(), |s| s.to_string_lossy().into_owned());
    Path::new("runs").join(stem)
}

/// This process's rank among the processes of one distributed run (0 when it runs alone): the
/// job's communicator once MPI is up, else the rank the launcher put in the environment. Only
/// rank 0 writes logs, so `mpirun -n 4 msl run …` logs once.
pub fn rank() -> usize {
    crate::spmd::rank()
}

/// The [`ScalarLog`] of `msl run`, `msl test --logdir` and the REPL: a TensorBoard event file
/// under `dir`, made when the first value is logged (a program that logs nothing leaves no
/// folder behind), on rank 0 only.
pub struct TensorBoard {
    dir: PathBuf,
    writer: Option<EventWriter>,
    writes: bool,
}

impl TensorBoard {
    pub fn new(dir: PathBuf) -> TensorBoard {
        TensorBoard { dir, writer: None, writes: rank() == 0 }
    }
}

impl ScalarLog for TensorBoard {
    fn scalar(&mut self, tag: &str, step: i64, value: f64) -> Result<(), String> {
        if !self.writes {
            return Ok(());
        }
        let w = match &mut self.writer {
            Some(w) => w,
            None => {
                let w = EventWriter::create(&self.dir).map_err(|e| {
                    format!(
                        "cannot write TensorBoard events into `{}`: {e} (choose another `--logdir`)",
                        self.dir.display()
                    )
                })?;
                self.writer.insert(w)
            }
        };
        w.scalar(tag, step, value as f32, crate::tfevents::wall_time())
            .map_err(|e| format!("cannot write TensorBoard events to `{}`: {e}", w.path().display()))
    }
}

/// A [`ScalarLog`] shared by several interpreters in turn (the REPL makes one per input, and
/// they all append to one file).
pub struct Shared(pub std::rc::Rc<std::cell::RefCell<TensorBoard>>);

impl ScalarLog for Shared {
    fn scalar(&mut self, tag: &str, step: i64, value: f64) -> Result<(), String> {
        self.0.borrow_mut().scalar(tag, step, value)
    }
}
