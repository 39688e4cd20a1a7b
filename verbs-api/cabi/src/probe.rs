//! Running C against the installed rdma-core headers, for the libraries' layout tests: each
//! `#[repr(C)]` struct is compared field by field with what gcc says of Debian's header.

use std::process::Command;

/// Whether missing prerequisites fail the test (in CI) or skip it.
fn required() -> bool {
    std::env::var_os("CI").is_some()
}

/// Compiles and runs a C program that prints each of `exprs` (`size_t` values) after
/// `prelude`, and returns the values; `None` (having said why) when gcc or the headers are
/// missing outside CI.
pub fn c_values(prelude: &str, exprs: &[&str]) -> Option<Vec<usize>> {
    let dir = std::env::temp_dir().join(format!(
        "roce-cabi-probe-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
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
            eprintln!("SKIPPED: no rdma-core headers (apt-get install libibverbs-dev librdmacm-dev): {why}");
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

/// Compares each `(C expression, our value)` row (see [`layout_rows!`](crate::layout_rows))
/// with the C value after `prelude` (the `#include`s), and fails naming every mismatch.
/// Skips, saying so, where gcc or the headers are missing outside CI.
pub fn assert_layouts(prelude: &str, rows: &[(String, usize)]) {
    let exprs: Vec<&str> = rows.iter().map(|(expr, _)| expr.as_str()).collect();
    let Some(c_values) = c_values(prelude, &exprs) else {
        return;
    };
    let mismatches: Vec<String> = rows
        .iter()
        .zip(&c_values)
        .filter(|((_, ours), theirs)| ours != *theirs)
        .map(|((expr, ours), theirs)| format!("{expr}: ours {ours}, C {theirs}"))
        .collect();
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}

/// Rows for [`assert_layouts`]: for each `struct { field, ... }`, its `sizeof` and the
/// `offsetof` of each field named, with our values.
#[macro_export]
macro_rules! layout_rows {
    ($($t:ident { $($field:ident),* $(,)? })*) => {{
        let mut rows: Vec<(String, usize)> = Vec::new();
        $(
            rows.push((
                format!("sizeof(struct {})", stringify!($t)),
                ::core::mem::size_of::<$t>(),
            ));
            $(rows.push((
                format!("offsetof(struct {}, {})", stringify!($t), stringify!($field)),
                ::core::mem::offset_of!($t, $field),
            ));)*
        )*
        rows
    }};
}
