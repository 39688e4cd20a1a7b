//! What the tools' integration tests share: running `roce` inside a namespace, waiting for
//! its server, reading its output, our C ABI libraries, and the rxe VM (`rxe`).
#![allow(dead_code)] // each test file uses its own subset

pub mod rxe;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use roce_provider::netns::{prerequisite, Netns};

/// `roce TOOL ARGS...` inside `ns`, bounded to a minute, with its output captured.
pub fn roce_in(ns: &Netns, tool: &str, args: &[&str]) -> Command {
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", &ns.name, "timeout", "60"])
        .args([env!("CARGO_BIN_EXE_roce"), tool])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Waits until something listens on TCP `port` inside `ns` (bounded).
pub fn wait_for_listener(ns: &Netns, port: u16) {
    wait_for_listener_in(&ns.name, port);
}

/// Waits until something listens on TCP `port` inside the namespace named `ns` (bounded:
/// a server starts in well under a minute even on a loaded machine).
pub fn wait_for_listener_in(ns: &str, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let output = Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                "ss",
                "-Hltn",
                &format!("sport = :{port}"),
            ])
            .output()
            .unwrap();
        if !output.stdout.is_empty() {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on {port} in {ns}");
}

/// A program's stdout and stderr, for assertions and failure messages.
pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// How a program ended, then its stdout and stderr: for failure messages, where an empty
/// output alone does not tell a program killed by its time limit (`timeout`'s 124; stdout
/// buffered and lost) or by a signal from one that printed nothing.
pub fn said(output: &Output) -> String {
    use std::os::unix::process::ExitStatusExt;
    let status = output.status;
    let how = match (status.code(), status.signal()) {
        (Some(124), _) => "exit status 124: its time limit ended it".to_string(),
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => format!("{status}"),
    };
    format!("[{how}]\n{}", text(output))
}

/// Whether `text` has a perftest result row for `size` bytes and `iters` iterations.
pub fn has_row(text: &str, size: &str, iters: &str) -> bool {
    text.lines().any(|line| {
        let mut words = line.split_whitespace();
        words.next() == Some(size) && words.next() == Some(iters)
    })
}

/// Where cargo put the `roce` binary and, after [`build_libraries`], our libraries.
pub fn built_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_roce"))
        .parent()
        .expect("roce has a directory")
        .to_path_buf()
}

/// Builds our three libraries (`roce exec` puts them first on a program's library path) in
/// the profile of this test (cargo builds only the `roce` binary for it), once.
pub fn build_libraries() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let mut cargo = Command::new(env!("CARGO"));
        cargo.args([
            "build",
            "-p",
            "roce-ibverbs",
            "-p",
            "roce-rdmacm-shim",
            "-p",
            "roce-mlx5",
            "-p",
            "roce-efa",
        ]);
        if built_dir().ends_with("release") {
            cargo.arg("--release");
        }
        let status = cargo.status().expect("run cargo");
        assert!(status.success(), "building the libraries failed");
    });
}

/// Whether Debian installed `program`.
pub fn installed(program: &str) -> bool {
    Path::new("/usr/bin").join(program).exists()
}

/// `roce exec PROGRAM ARGS...` inside `ns`, bounded to a minute.
pub fn exec_in(ns: &Netns, program: &[&str]) -> Command {
    exec_in_named(&ns.name, program)
}

/// [`exec_in`] the namespace called `name` (one this test did not create, such as the rxe
/// VM's `rxe-host`).
pub fn exec_in_named(name: &str, program: &[&str]) -> Command {
    build_libraries();
    let mut command = Command::new("ip");
    command
        .args(["netns", "exec", name, "timeout", "60"])
        .args([env!("CARGO_BIN_EXE_roce"), "exec", "--"])
        .args(program)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// `name@VERSION` of every dynamic symbol of `file` that is undefined (imports) or defined
/// (exports), from readelf.
pub fn dynamic_symbols(file: &Path, defined: bool) -> Vec<String> {
    let output = Command::new("readelf")
        .args(["--dyn-syms", "-W"])
        .arg(file)
        .output()
        .expect("readelf (binutils)");
    assert!(output.status.success(), "readelf {}", file.display());
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let (section, name) = (words.get(6)?, words.get(7)?);
            ((*section == "UND") != defined).then(|| name.replace("@@", "@"))
        })
        .collect()
}

/// Whether gcc runs and `dev_file` (a header or library the program needs) is installed;
/// says SKIPPED, or fails in CI, naming `packages` when not.
pub fn can_compile_c(test: &str, packages: &str, dev_file: &str) -> bool {
    let gcc = Command::new("gcc").arg("--version").output().is_ok();
    prerequisite(test, packages, gcc && Path::new(dev_file).exists())
}

/// A C program of `tests/c`, compiled into a temporary folder (removed when dropped).
pub struct CProgram {
    pub dir: tempfile::TempDir,
    pub binary: PathBuf,
}

impl CProgram {
    /// The binary's path, as a program argument.
    pub fn path(&self) -> &str {
        self.binary.to_str().expect("a UTF-8 temporary path")
    }
}

/// `tests/c/NAME.c` compiled by gcc and linked with `libs` (`-lNAME` or a library's path).
pub fn compile_c(name: &str, libs: &[&str]) -> CProgram {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    let dir = tempfile::tempdir().expect("a temporary folder");
    let binary = dir.path().join(name);
    let compiled = Command::new("gcc")
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .args(libs)
        .output()
        .expect("run gcc");
    assert!(
        compiled.status.success(),
        "gcc {name}.c: {}",
        text(&compiled)
    );
    CProgram { dir, binary }
}

/// libibverbs-dev's header, which the libibverbs C programs need.
pub const VERBS_H: &str = "/usr/include/infiniband/verbs.h";

/// Compiles `tests/c/NAME.c` against libibverbs and runs it on `device` inside `ns` under
/// `roce exec`: it must exit 0 printing "ok".
pub fn run_verbs_program(name: &str, ns: &Netns, device: &str) {
    let program = compile_c(name, &["-libverbs"]);
    let run = exec_in(ns, &[program.path(), device]).output().unwrap();
    assert!(
        run.status.success() && text(&run).contains("ok"),
        "{}",
        text(&run)
    );
}
