//! `roce dump` as a user runs it: on the bundled rxe captures, and on damaged copies.

use std::path::Path;
use std::process::{Command, Output};

use roce_provider::capture::{read_frames, write_frames, CapturedFrame};
use roce_tests::{capture_files, captures_dir, expected_counts};
use roce_wire::Opcode;

fn roce_dump(args: &[&str], files: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_roce"))
        .arg("dump")
        .args(args)
        .args(files)
        .output()
        .expect("run roce")
}

fn stdout_lines(output: &Output) -> Vec<String> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn summary_of_each_capture_matches_its_readme() {
    let expected = expected_counts();
    for path in capture_files() {
        let name = path.file_name().unwrap().to_str().unwrap();
        let want = &expected[name];
        let output = roce_dump(&["--summary"], &[&path]);
        assert_eq!(output.status.code(), Some(0), "{name}");
        let lines = stdout_lines(&output);
        let (last, per_opcode) = lines.split_last().unwrap();
        let want_lines: Vec<String> = want
            .counts
            .iter()
            .map(|(&value, count)| format!("{} {count}", Opcode::try_from(value).unwrap().name()))
            .collect();
        assert_eq!(per_opcode, &want_lines[..], "{name}");
        let frames = read_frames(&path).unwrap().len();
        let roce: usize = want.counts.values().sum();
        assert_eq!(
            last,
            &format!("frames={frames} roce={roce} icrc_bad=0 malformed=0")
        );
    }
}

#[test]
fn frame_lines_show_every_field() {
    let output = roce_dump(&[], &[&captures_dir().join("write_bw.pcap")]);
    assert_eq!(output.status.code(), Some(0));
    let lines = stdout_lines(&output);
    let first_write = lines
        .iter()
        .find(|line| line.contains("RC_RDMA_WRITE_FIRST"))
        .unwrap();
    assert!(
        first_write.ends_with(
            " 10.88.0.12 -> 10.88.0.11 sport=49513 RC_RDMA_WRITE_FIRST qpn=0x000013 \
             psn=0xaba3f6 ack=0 reth(va=0x5558d43dd000 rkey=0x00000448 len=4096) len=1024 icrc=ok"
        ),
        "{first_write}"
    );
    let ack = lines
        .iter()
        .find(|line| line.contains("RC_ACKNOWLEDGE"))
        .unwrap();
    assert!(
        ack.contains("aeth(ACK credits=unlimited msn=1) len=0 icrc=ok"),
        "{ack}"
    );
    // The TCP 18515 exchange of perftest is counted, not printed.
    let frames = read_frames(&captures_dir().join("write_bw.pcap"))
        .unwrap()
        .len();
    assert_eq!(
        lines.len(),
        1000 + 1,
        "one line per RoCE frame plus the totals"
    );
    assert_eq!(
        lines.last().unwrap(),
        &format!("frames={frames} roce=1000 icrc_bad=0 malformed=0")
    );
}

/// The first RoCEv2 frames of a capture, for making damaged copies.
fn sample_frames() -> Vec<CapturedFrame> {
    let frames = read_frames(&captures_dir().join("send_lat.pcap")).unwrap();
    frames
        .into_iter()
        .filter(|f| f.data.len() > 42 && f.data[36..38] == [0x12, 0xb7])
        .collect()
}

#[test]
fn corrupted_and_malformed_frames_are_counted_and_fail_the_exit_status() {
    let mut frames: Vec<CapturedFrame> = sample_frames().into_iter().take(5).collect();
    let last = frames[0].data.len() - 5;
    frames[0].data[last] ^= 0x10; // in the payload: ICRC mismatch
    frames[1].data.truncate(50); // shorter than its IP length
    frames[2].data[42] = 0x15; // reserved opcode (ICRC no longer matters)
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("damaged.pcap");
    write_frames(&path, &frames).unwrap();

    let output = roce_dump(&[], &[&path]);
    assert_eq!(output.status.code(), Some(1));
    let lines = stdout_lines(&output);
    assert!(
        lines[0].starts_with("1 ") && lines[0].ends_with(" icrc=BAD"),
        "{}",
        lines[0]
    );
    assert!(lines[1].starts_with("2 malformed: "), "{}", lines[1]);
    assert_eq!(lines[2], "3 unknown opcode 0x15");
    assert!(lines[3].ends_with(" icrc=ok") && lines[4].ends_with(" icrc=ok"));
    assert_eq!(lines[5], "frames=5 roce=5 icrc_bad=1 malformed=2");
}

#[test]
fn several_files_add_up() {
    let files = capture_files();
    let paths: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let output = roce_dump(&["--summary"], &paths);
    assert_eq!(output.status.code(), Some(0));
    let frames: usize = files
        .iter()
        .map(|path| read_frames(path).unwrap().len())
        .sum();
    let roce: usize = expected_counts()
        .values()
        .flat_map(|e| e.counts.values())
        .sum();
    let lines = stdout_lines(&output);
    assert_eq!(
        lines.last().unwrap(),
        &format!("frames={frames} roce={roce} icrc_bad=0 malformed=0")
    );
}

#[test]
fn unreadable_file_exits_2() {
    let output = roce_dump(&[], &[Path::new("/nonexistent/x.pcap")]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/x.pcap"));
}

#[test]
fn cm_mads_get_their_message_decoded() {
    let output = roce_dump(&[], &[&captures_dir().join("rping_rdmacm.pcap")]);
    assert_eq!(output.status.code(), Some(0));
    let cm_lines: Vec<String> = stdout_lines(&output)
        .into_iter()
        .filter(|line| line.contains(" CM_"))
        .collect();
    let names: Vec<&str> = cm_lines
        .iter()
        .map(|line| {
            line.split(" CM_")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
        })
        .collect();
    assert_eq!(names, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    assert!(cm_lines[0].starts_with("1 10.88.0.12 -> 10.88.0.11 "));
    assert!(cm_lines[0].ends_with(
        "CM_REQ local_id=0x6fd0c1a6 sid=tcp:7174 qpn=0x00001c psn=0x709d4f mtu=3 rres=1 \
         idepth=1 retry=7 rnr_retry=7 ack_timeout=19 tid=0x2a6c1d06f"
    ));
    assert!(cm_lines[1].ends_with(
        "CM_REP local_id=0x0322dfd9 remote_id=0x6fd0c1a6 qpn=0x00001c psn=0x94e955 rres=1 \
         idepth=1 ack_delay=15 rnr_retry=7 tid=0x2a6c1d06f"
    ));
}

/// A copy of `name` without its last 10 bytes, as a killed writer leaves a capture: the
/// last record is cut, every one before it complete.
fn cut_copy(dir: &Path, name: &str) -> (std::path::PathBuf, usize) {
    let original = captures_dir().join(name);
    let bytes = std::fs::read(&original).unwrap();
    let cut = dir.join(format!("cut-{name}"));
    std::fs::write(&cut, &bytes[..bytes.len() - 10]).unwrap();
    (cut, read_frames(&original).unwrap().len())
}

#[test]
fn a_cut_capture_is_decoded_up_to_the_cut_and_the_next_file_is_read() {
    let dir = tempfile::tempdir().unwrap();
    // One pcap and one pcapng, each followed by a whole file.
    for name in ["send_lat.pcap", "write_bw_64k.pcap"] {
        let (cut, total) = cut_copy(dir.path(), name);
        let whole = captures_dir().join("read_lat.pcap");
        let after = read_frames(&whole).unwrap().len();
        for summary in [true, false] {
            let flags: &[&str] = if summary { &["--summary"] } else { &[] };
            let output = roce_dump(flags, &[&cut, &whole]);
            assert_eq!(output.status.code(), Some(2), "{name} {flags:?}");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                stderr.contains(&format!(
                    "stops inside a record after {} complete frames",
                    total - 1
                )),
                "{name} {flags:?}: {stderr}"
            );
            let lines = stdout_lines(&output);
            let last = lines.last().unwrap();
            assert!(
                last.starts_with(&format!("frames={} ", total - 1 + after)),
                "{name} {flags:?}: {last}"
            );
            if !summary {
                // The cut file's lines are the whole file's, up to the cut.
                let full = stdout_lines(&roce_dump(&[], &[&captures_dir().join(name)]));
                let before_cut: Vec<&String> = full
                    .iter()
                    .filter(|line| {
                        line.split(' ')
                            .next()
                            .and_then(|n| n.parse::<usize>().ok())
                            .is_some_and(|n| n < total)
                    })
                    .collect();
                let section: Vec<&String> = lines
                    .iter()
                    .skip(1)
                    .take_while(|line| !line.starts_with("# "))
                    .collect();
                assert_eq!(section, before_cut, "{name}");
                assert!(lines.contains(&format!("# {}", whole.display())));
            }
        }
    }
}
