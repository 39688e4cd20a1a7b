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
