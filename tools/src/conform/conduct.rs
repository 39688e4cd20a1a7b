//! Conducting the client side's scenarios: each on a fresh connection, judged and reported.

use std::io::{self, Write};

use roce_wire::Opcode;

use super::conn::Conn;
use super::link::Link;
use super::scenarios::{baseline, Scenario, RECEIVES_AT_MOST};
use super::target::{fresh_local, Options, Service, Target};
use super::verdict::{failed_check, failed_probe, write_suite, Line, Summary};

/// Runs `scenario` on a fresh connection; returns its observation, or an error saying why
/// no connection could be made (the caller decides whether that means BROKE).
pub fn conduct(
    target: &mut dyn Target,
    link: &mut Link,
    scenario: &Scenario,
    options: &Options,
) -> io::Result<Result<String, String>> {
    let local = fresh_local(link.ours.ip);
    let session = match target.connect(scenario.service, &local) {
        Ok(session) => session,
        Err(error) => return Ok(Err(format!("connect:{error}"))),
    };
    let mut conn = Conn::new(link, session.remote(), local, options.send_size);
    let observed = (scenario.run)(&mut conn)?;
    if scenario.service == Service::Send {
        use_up_receives(&mut conn)?;
    }
    // A server whose QP the scenario broke may have exited already: nothing to close.
    let _ = session.close();
    Ok(Ok(observed))
}

/// A send server finishes when its receives are used: SEND until it stops ACKing.
pub fn use_up_receives(conn: &mut Conn) -> io::Result<()> {
    for _ in 0..RECEIVES_AT_MOST {
        let at = conn.next;
        let answer = conn.step(&[conn.send(Opcode::RcSendOnly, at, conn.send_size)], 1)?;
        if answer != format!("ACK@{at}") {
            break;
        }
    }
    Ok(())
}

/// Runs `scenarios` in order, one result line each and the summary line on `out`; a
/// scenario's liveness probe is its service's baseline, then `--check`.
pub fn run_suite(
    target: &mut dyn Target,
    link: &mut Link,
    scenarios: &[&Scenario],
    options: &Options,
    out: &mut dyn Write,
) -> io::Result<Summary> {
    write_suite(scenarios, out, |scenario| {
        let outcome = conduct(target, link, scenario, options)?;
        Line::judge(scenario.name, scenario.expected, outcome, |_| {
            let probe = baseline(scenario.service);
            let seen = conduct(target, link, probe, options)?;
            Ok(failed_probe(probe.name, probe.expected, seen)
                .into_iter()
                .chain(failed_check(options)?)
                .collect())
        })
    })
}
