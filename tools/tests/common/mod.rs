//! What the tools' integration tests share: running `roce` inside a namespace, waiting for
//! its server, and reading its output.
#![allow(dead_code)] // each test file uses its own subset

use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use roce_provider::netns::Netns;

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
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let output = ns
            .run(&["ss", "-Hltn", &format!("sport = :{port}")])
            .unwrap();
        if !output.stdout.is_empty() {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on {port} in {}", ns.name);
}

/// A program's stdout and stderr, for assertions and failure messages.
pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Whether `text` has a perftest result row for `size` bytes and `iters` iterations.
pub fn has_row(text: &str, size: &str, iters: &str) -> bool {
    text.lines().any(|line| {
        let mut words = line.split_whitespace();
        words.next() == Some(size) && words.next() == Some(iters)
    })
}
