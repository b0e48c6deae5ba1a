//! Servers on loopback, for tests that put a double or a proxy behind HTTP:
//! this crate's, and the CLI's, which include it as
//! `#[path = "../../../policy-client/tests/loopback/mod.rs"] mod loopback;` in
//! `tests/cli/main.rs`.
#![allow(dead_code)] // each test binary uses its own subset

use std::future::Future;
use std::net::SocketAddr;

/// Run `server` on a listener at a free loopback port, from a thread of its
/// own (a runtime of two workers) until the test ends; the address.
pub fn spawn<F, Fut>(server: F) -> SocketAddr
where
    F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            server(tokio::net::TcpListener::from_std(listener).unwrap()).await;
        });
    });
    addr
}

/// Serve `app` with [`spawn`]; the address.
pub fn serve(app: axum::Router) -> SocketAddr {
    spawn(|listener| async move { axum::serve(listener, app).await.unwrap() })
}
