//! Sharded runs from the command line: MPI under a launcher, the job's size checked against the
//! mesh, the program partitioned (`lang::shard`), and `--ranks N`, which starts `mpirun` itself.

use lang::check::Checked;
use lang::diag::{Diagnostic, Severity};
use lang::dist::{Mesh, Spmd};
use std::rc::Rc;

thread_local! {
    /// The sharded run this command takes part in (set once the program checked).
    static JOB: std::cell::RefCell<Option<Rc<Spmd>>> = const { std::cell::RefCell::new(None) };
}

/// The sharded run of this process, if it is one.
pub(crate) fn job() -> Option<Rc<Spmd>> {
    JOB.with(|j| j.borrow().clone())
}

/// This process's rank (0 outside a sharded run; the launcher's number before MPI is up).
pub(crate) fn rank() -> usize {
    job().map(|j| j.rank()).or_else(dist::launcher_rank).or_else(slurm_rank).unwrap_or(0)
}

fn slurm_rank() -> Option<usize> {
    std::env::var("SLURM_PROCID").ok().and_then(|r| r.trim().parse().ok())
}

fn fail(msg: String) -> u8 {
    match dist::launcher_rank() {
        Some(r) => eprintln!("error: rank {r}: {msg}"),
        None => eprintln!("error: {msg}"),
    }
    2
}

/// Readies a checked program for the job this process is part of: nothing outside a launcher
/// (a mesh then runs on one process with every layout whole); under one, starts MPI, checks the
/// job against the mesh and partitions the program. Renders the sharding warnings on rank 0;
/// `deny` makes them errors.
pub(crate) fn prepare(c: &mut Checked, json: bool, deny: bool) -> Result<(), u8> {
    let Some(launched) = dist::launcher_size() else { return Ok(()) };
    let mesh = Mesh::of(&c.program);
    let mpi = match dist::Mpi::start(mesh.clone().unwrap_or_default()) {
        Some(m) => m,
        None => return Err(fail("MPI could not be initialised".into())),
    };
    let world = mpi.size();
    if world == 1 && launched > 1 {
        return Err(fail(format!(
            "the launcher started {launched} processes, but each sees an MPI world of 1: the launcher and \
             the MPI library msl uses are from different MPI implementations (msl uses Open MPI; run its `mpirun`)"
        )));
    }
    let Some(mesh) = mesh else {
        if world == 1 {
            return Ok(());
        }
        return Err(fail(format!(
            "this job has {world} processes, but the program declares no mesh to spread its work over; add \
             e.g. `mesh M[dp = {world}]` and layouts, or run it on one process"
        )));
    };
    let devices = mesh.devices();
    if devices != world as i64 {
        let axes: Vec<String> = mesh.names.iter().zip(&mesh.sizes).map(|(n, s)| format!("{n} = {s}")).collect();
        return Err(fail(format!(
            "the mesh has {devices} devices ({}) but this job has {world} processes; start {devices} \
             (`mpirun -n {devices}`, `msl run --ranks {devices}`) or give `--mesh` sizes whose product is {world}",
            axes.join(", ")
        )));
    }
    let report = lang::passes::shard(&mut c.program);
    let rank = lang::dist::Collectives::rank(&mpi);
    let mut warnings: Vec<Diagnostic> = report.warnings;
    if deny {
        for w in warnings.iter_mut() {
            w.severity = Severity::Error;
        }
    }
    if rank == 0 && !warnings.is_empty() {
        crate::run::render(&warnings, c, json);
    }
    if deny && !warnings.is_empty() {
        return Err(1);
    }
    let spmd = Rc::new(Spmd::new(mesh, Box::new(mpi)));
    JOB.with(|j| *j.borrow_mut() = Some(spmd));
    Ok(())
}

/// `msl run --comm-report`.
pub(crate) static COMM_REPORT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// With `--comm-report`, rank 0 lists on stderr what each collective site sent from it: its
/// location, kind, calls and bytes, as counted by the communicator during the run.
pub(crate) fn comm_report(c: &Checked) {
    if !COMM_REPORT.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let Some(j) = job() else {
        eprintln!(
            "note: `--comm-report`: not a sharded run (start it with `--ranks N` or `mpirun`), so nothing was sent"
        );
        return;
    };
    if j.rank() != 0 {
        return;
    }
    let traffic = j.traffic.borrow();
    let (calls, bytes) = traffic.values().fold((0, 0), |(c, b), &(_, _, n, x)| (c + n, b + x));
    let mut s = format!("collectives run by rank 0: {calls} calls, {bytes} bytes sent\n");
    for (&(site, ..), &(span, kind, n, total)) in traffic.iter() {
        let (line, col) = c.sources.line_col(span.file, span.start);
        let per = total.checked_div(n).unwrap_or(0);
        let calls = if n == 1 { "call" } else { "calls" };
        s.push_str(&format!("  #{site}  {line}:{col}  {kind}  {n} {calls}  {per} bytes per call  {total} bytes\n"));
    }
    eprint!("{s}");
}

/// Ends every rank of the job after a run-time error on this one (the others would wait for it
/// in their next collective).
pub(crate) fn abort_job(code: u8) {
    if let Some(j) = job() {
        if j.comm.world() > 1 {
            j.comm.abort(i32::from(code));
        }
    }
}

/// `msl run --ranks N FILE …`: runs the same command under `mpirun -n N`, with what running as
/// root and more ranks than cores need.
pub(crate) fn launch(ranks: usize) -> u8 {
    if dist::launcher_size().is_some() {
        return fail("`--ranks` starts `mpirun` itself; under a launcher, leave it out".into());
    }
    let Ok(exe) = std::env::current_exe() else { return fail("cannot find the msl executable".into()) };
    let mut args: Vec<String> = Vec::new();
    let mut skip = false;
    for a in std::env::args().skip(1) {
        if skip {
            skip = false;
            continue;
        }
        if a == "--ranks" {
            skip = true;
            continue;
        }
        if a.starts_with("--ranks=") {
            continue;
        }
        args.push(a);
    }
    let mut cmd = std::process::Command::new("mpirun");
    cmd.arg("-n").arg(ranks.to_string()).arg("--oversubscribe");
    // `mpirun` refuses root unless asked; containers often run as root.
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    // Fail fast: one rank's error ends the job.
    cmd.arg("--mca").arg("orte_abort_on_non_zero_status").arg("1");
    cmd.arg(exe).args(&args);
    // A session folder of the job's own: jobs started at once share `/tmp/ompi.<host>.<uid>`
    // otherwise, and one that ends removes it while another is making its own folder there.
    let session = own_session_dir(&mut cmd);
    let status = cmd.status();
    if let Some(d) = session {
        let _ = std::fs::remove_dir_all(d);
    }
    match status {
        Ok(s) => s.code().map(|c| c.clamp(0, 255) as u8).unwrap_or(2),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fail("`--ranks` needs Open MPI's `mpirun`, which is not installed (scripts/setup.sh installs it)".into())
        }
        Err(e) => fail(format!("cannot start mpirun: {e}")),
    }
}

/// Points Open MPI's session folder (4.x: `orte_tmpdir_base`; 5.x: `prte_tmpdir_base`) at a new
/// folder for this job, unless the user chose one; returns it, to be removed after the job.
pub(crate) fn own_session_dir(cmd: &mut std::process::Command) -> Option<std::path::PathBuf> {
    const VARS: [&str; 2] = ["OMPI_MCA_orte_tmpdir_base", "PRTE_MCA_prte_tmpdir_base"];
    if VARS.iter().any(|v| std::env::var_os(v).is_some()) {
        return None;
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    // Short: Open MPI puts Unix sockets in it, whose paths may be at most 107 bytes.
    let dir = std::env::temp_dir().join(format!("msl-mpi-{}-{nanos:x}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    for v in VARS {
        cmd.env(v, &dir);
    }
    Some(dir)
}

/// `--mesh dp=4,mp=1`: the sizes that replace the file's.
pub(crate) fn parse_mesh(s: &str) -> Result<Vec<(String, i64)>, String> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let Some((name, size)) = part.split_once('=') else {
            return Err(format!("`--mesh {s}`: expected `axis=size` pairs such as `dp=4,mp=1`"));
        };
        let size: i64 = match size.trim().parse() {
            Ok(n) if n > 0 => n,
            _ => return Err(format!("`--mesh {s}`: the size of `{}` must be a positive integer", name.trim())),
        };
        if out.iter().any(|(n, _): &(String, i64)| n == name.trim()) {
            return Err(format!("`--mesh {s}`: axis `{}` is given twice", name.trim()));
        }
        out.push((name.trim().to_string(), size));
    }
    if out.is_empty() {
        return Err(format!("`--mesh {s}`: expected `axis=size` pairs such as `dp=4,mp=1`"));
    }
    Ok(out)
}
