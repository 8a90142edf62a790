//! A fault-injecting TCP proxy on 127.0.0.1, for partition tests without network namespaces:
//! put it between one agent and the broker (`--broker http://<proxy>`) and switch its mode.
//!
//! - [`Mode::Pass`]: bytes flow both ways.
//! - [`Mode::Blackhole`]: nothing flows, on new or existing connections, and nothing is closed —
//!   a cable pulled out. Bytes already read are held, not dropped, and flow once the mode is
//!   `Pass` again (TCP would retransmit them after a partition heals); connections accepted
//!   meanwhile connect upstream only then.
//! - [`Mode::Reset`]: every existing connection is reset (RST, both sides) and new ones are
//!   reset as soon as they are accepted.
//!
//! The proxy runs on the current tokio runtime and stops when dropped.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Blackhole,
    Reset,
}

pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream`, in [`Mode::Pass`].
    pub async fn start(upstream: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, watching) = watch::channel(Mode::Pass);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                tokio::spawn(connection(client, upstream, watching.clone()));
            }
        });
        Ok(FaultProxy { addr, mode, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Open connections see the mode's sender gone and reset.
        self.task.abort();
    }
}

/// Closes with RST rather than FIN.
#[allow(deprecated)] // set_linger: a zero linger never blocks on close, which is what we want
fn reset(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// Waits while the mode is `Blackhole`; `false` when the connection must end (reset, or the
/// proxy is gone).
async fn may_flow(mode: &mut watch::Receiver<Mode>) -> bool {
    match mode.wait_for(|m| *m != Mode::Blackhole).await {
        Ok(m) => *m == Mode::Pass,
        Err(_) => false,
    }
}

/// How one direction of a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    /// EOF or an error: passed on as a shutdown.
    Ended,
    /// The proxy was told to reset (or is gone): reset both sides.
    Reset,
}

async fn connection(mut client: TcpStream, upstream: SocketAddr, mut mode: watch::Receiver<Mode>) {
    let _ = client.set_nodelay(true);
    if !may_flow(&mut mode).await {
        reset(&client);
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        reset(&client);
        return;
    };
    let _ = server.set_nodelay(true);
    let flow = {
        let (mut cr, mut cw) = client.split();
        let (mut sr, mut sw) = server.split();
        let up = pump(&mut cr, &mut sw, mode.clone());
        let down = pump(&mut sr, &mut cw, mode.clone());
        tokio::pin!(up, down);
        let (mut up_done, mut down_done) = (false, false);
        loop {
            let flow = tokio::select! {
                f = &mut up, if !up_done => { up_done = true; f }
                f = &mut down, if !down_done => { down_done = true; f }
            };
            if flow == Flow::Reset || (up_done && down_done) {
                break flow;
            }
        }
    };
    if flow == Flow::Reset {
        reset(&client);
        reset(&server);
    }
}

/// Copies `from` → `to` while the mode lets bytes flow; bytes read while blackholed are held
/// until the mode changes.
async fn pump(
    from: &mut ReadHalf<'_>,
    to: &mut WriteHalf<'_>,
    mut mode: watch::Receiver<Mode>,
) -> Flow {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if !may_flow(&mut mode).await {
            return Flow::Reset;
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return Flow::Ended;
                }
                Ok(n) => n,
            },
            changed = mode.changed() => {
                if changed.is_err() {
                    return Flow::Reset;
                }
                continue;
            }
        };
        if !may_flow(&mut mode).await {
            return Flow::Reset;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return Flow::Ended;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server; its address.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream, within: Duration) -> std::io::Result<Option<Vec<u8>>> {
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        match tokio::time::timeout(within, s.read_exact(&mut buf)).await {
            Ok(r) => r.map(|_| Some(buf.to_vec())),
            Err(_) => Ok(None),
        }
    }

    #[tokio::test]
    async fn pass_blackhole_heal_and_reset() {
        let proxy = FaultProxy::start(echo().await).await.unwrap();
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        let long = Duration::from_secs(5);
        assert_eq!(round_trip(&mut open, long).await.unwrap().unwrap(), b"ping");

        // Blackholed: nothing comes back on the open connection or on a new one.
        proxy.set(Mode::Blackhole);
        let short = Duration::from_millis(300);
        assert_eq!(round_trip(&mut open, short).await.unwrap(), None);
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut fresh, short).await.unwrap(), None);

        // Healed: what was held arrives, and both connections work again.
        proxy.set(Mode::Pass);
        let mut held = [0u8; 4];
        tokio::time::timeout(long, open.read_exact(&mut held))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&held, b"ping");
        let mut held = [0u8; 4];
        tokio::time::timeout(long, fresh.read_exact(&mut held))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&held, b"ping");
        assert_eq!(round_trip(&mut open, long).await.unwrap().unwrap(), b"ping");

        // Reset: the open connection and a new one are reset.
        proxy.set(Mode::Reset);
        let mut buf = [0u8; 1];
        let r = tokio::time::timeout(long, open.read(&mut buf))
            .await
            .unwrap();
        assert!(
            matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "{r:?}"
        );
        let mut refused = TcpStream::connect(proxy.addr()).await.unwrap();
        let r = tokio::time::timeout(long, refused.read(&mut buf))
            .await
            .unwrap();
        assert!(
            matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "{r:?}"
        );
    }
}
