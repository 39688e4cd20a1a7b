//! Checks that the kernel of a namespace still answers ordinary traffic (ARP and UDP) while
//! our XDP program sits on its interface: with sockets of our own, so no `ping` is needed.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::thread;
use std::time::Duration;

use roce_provider::netns::{self, Netns};

/// A port well away from RoCEv2's 4791, which our program would take.
const ECHO_PORT: u16 = 7_007;

/// Runs `f` on a thread inside `ns` (a thread's network namespace is its own).
fn in_namespace<T: Send + 'static>(
    ns: &Netns,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let name = ns.name.clone();
    thread::spawn(move || {
        netns::enter(&name)?;
        f()
    })
    .join()
    .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// Sends a datagram from `client` to a socket in `server` at `server_ip` and waits for it to
/// be echoed back (the first datagram also makes the kernels resolve each other by ARP).
/// Fails with the reason when no answer comes within a few seconds.
pub fn kernel_echoes_udp(server: &Netns, server_ip: &str, client: &Netns) -> io::Result<()> {
    let address: SocketAddr = format!("{server_ip}:{ECHO_PORT}")
        .parse()
        .map_err(io::Error::other)?;
    let socket = in_namespace(server, move || UdpSocket::bind(address))?;
    socket.set_read_timeout(Some(Duration::from_secs(5)))?;
    let echo = thread::spawn(move || -> io::Result<()> {
        let mut buffer = [0u8; 64];
        let (len, from) = socket.recv_from(&mut buffer)?;
        socket.send_to(&buffer[..len], from)?;
        Ok(())
    });
    let reply = in_namespace(client, move || {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        socket.set_read_timeout(Some(Duration::from_secs(5)))?;
        socket.send_to(b"still there?", address)?;
        let mut buffer = [0u8; 64];
        let len = socket.recv(&mut buffer)?;
        Ok(buffer[..len].to_vec())
    });
    echo.join()
        .map_err(|_| io::Error::other("the echo thread panicked"))??;
    if reply? == b"still there?" {
        Ok(())
    } else {
        Err(io::Error::other("the echo came back changed"))
    }
}
