//! A TCP forwarder on a fixed loopback port that a test can take down and bring
//! back: down closes the listening socket (new connections are refused) and
//! cuts every open connection, as a crashed server would; up listens again on
//! the same port. It stands between a process under test and a sink whose
//! address cannot change.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

#[derive(Debug, Default)]
struct Tasks {
    accept: Option<JoinHandle<()>>,
    connections: Vec<AbortHandle>,
}

#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    target: SocketAddr,
    tasks: Arc<Mutex<Tasks>>,
}

impl TcpProxy {
    /// Forwards a new port on 127.0.0.1 to `target`.
    pub async fn start(target: SocketAddr) -> TcpProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let proxy = TcpProxy {
            addr,
            target,
            tasks: Arc::default(),
        };
        proxy.serve(listener);
        proxy
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    fn serve(&self, listener: TcpListener) {
        let tasks = Arc::clone(&self.tasks);
        let target = self.target;
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let forward = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                let mut tasks = tasks.lock().expect("proxy state");
                tasks.connections.retain(|c| !c.is_finished());
                tasks.connections.push(forward.abort_handle());
            }
        });
        self.tasks.lock().expect("proxy state").accept = Some(accept);
    }

    /// Stops listening and cuts every open connection; returns once the
    /// listening socket is closed.
    pub async fn down(&self) {
        let accept = self.tasks.lock().expect("proxy state").accept.take();
        if let Some(accept) = accept {
            accept.abort();
            // Resolves once the task, and so the listener it owns, is dropped;
            // after that no new connection can be registered.
            let _ = accept.await;
        }
        let connections = std::mem::take(&mut self.tasks.lock().expect("proxy state").connections);
        for connection in connections {
            connection.abort();
        }
    }

    /// Listens on the same port again.
    pub async fn up(&self) {
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(listener) => break listener,
                Err(e) if tries < 50 => {
                    tries += 1;
                    eprintln!(
                        "rebinding the proxy on {} failed ({e}); retrying",
                        self.addr
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("cannot listen on {} again: {e}", self.addr),
            }
        };
        self.serve(listener);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        if let Ok(mut tasks) = self.tasks.lock() {
            if let Some(accept) = tasks.accept.take() {
                accept.abort();
            }
            for connection in tasks.connections.drain(..) {
                connection.abort();
            }
        }
    }
}
