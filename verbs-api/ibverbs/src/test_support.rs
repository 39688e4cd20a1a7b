//! Running C against the installed rdma-core headers, for tests.

use std::process::Command;

/// Whether missing prerequisites fail the test (in CI) or skip it.
pub(crate) fn required() -> bool {
    std::env::var_os("CI").is_some()
}

/// Compiles and runs a C program that prints each of `exprs` (`size_t` values) after
/// `prelude`, and returns the values; `None` (having said why) when gcc or the headers are
/// missing outside CI.
pub(crate) fn c_values(prelude: &str, exprs: &[&str]) -> Option<Vec<usize>> {
    let dir = std::env::temp_dir().join(format!("roce-ibverbs-c-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    let source = dir.join("probe.c");
    let binary = dir.join("probe");
    let mut program = format!("{prelude}#include <stdio.h>\nint main(void) {{\n");
    for expr in exprs {
        program.push_str(&format!("    printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    program.push_str("    return 0;\n}\n");
    std::fs::write(&source, program).expect("write the probe");
    let compiled = Command::new("gcc")
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .output();
    let compiled = match compiled {
        Ok(output) if output.status.success() => true,
        Ok(output) => {
            let why = String::from_utf8_lossy(&output.stderr).into_owned();
            if !why.contains("No such file") || required() {
                panic!("gcc failed on the probe: {why}");
            }
            eprintln!("SKIPPED: no rdma-core headers (apt-get install libibverbs-dev): {why}");
            false
        }
        Err(error) => {
            assert!(!required(), "gcc is needed in CI: {error}");
            eprintln!("SKIPPED: no gcc: {error}");
            false
        }
    };
    if !compiled {
        let _ = std::fs::remove_dir_all(&dir);
        return None;
    }
    let output = Command::new(&binary).output().expect("run the probe");
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8(output.stdout).expect("ASCII numbers");
    let values: Vec<usize> = text
        .lines()
        .map(|line| line.parse().expect("a number"))
        .collect();
    assert_eq!(values.len(), exprs.len());
    Some(values)
}
