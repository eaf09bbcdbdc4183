//! A TCP proxy a test can cut: it forwards between its clients and one port until cut, then passes
//! no byte either way (what arrives is dropped) while keeping every connection open, as a network
//! partition does; a side that closes still closes the other. A cut is for good.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Proxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    closed: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards each connection to 127.0.0.1:`to`.
    pub fn start(to: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the proxy");
        listener.set_nonblocking(true).unwrap();
        let p = Proxy {
            port: listener.local_addr().unwrap().port(),
            cut: Arc::new(AtomicBool::new(false)),
            closed: Arc::new(AtomicBool::new(false)),
            streams: Arc::new(Mutex::new(Vec::new())),
        };
        let (cut, closed, streams) = (p.cut.clone(), p.closed.clone(), p.streams.clone());
        std::thread::spawn(move || {
            while !closed.load(Ordering::Relaxed) {
                let Ok((down, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                down.set_nonblocking(false).unwrap();
                let Ok(up) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                let mut held = streams.lock().unwrap();
                held.push(down.try_clone().unwrap());
                held.push(up.try_clone().unwrap());
                for (from, to) in [
                    (down.try_clone().unwrap(), up.try_clone().unwrap()),
                    (up, down),
                ] {
                    let cut = cut.clone();
                    std::thread::spawn(move || pump(from, to, &cut));
                }
            }
        });
        p
    }

    /// From now on no byte passes either way; the connections stay open.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !cut.load(Ordering::Relaxed) && to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
        for s in self.streams.lock().unwrap().iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}
