//! The control plane's protections: socket mode and ownership, what is never replaced, the
//! TCP listener's loopback default and token, and the connection limits (count, size, idle
//! time, garbage).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_rpc::client::{Client, ClientError, Endpoint};
use nvmf_rpc::server::{judge_existing, Existing, TOO_MANY_CONNECTIONS, UNAUTHORIZED};
use nvmf_rpc::{
    build_module, serve_tcp, serve_unix, AuthToken, CallFn, RpcError, ServeError, ServerHandle,
    ServerOptions,
};
use serde_json::{json, Value};

const NOBODY: u32 = 65534;

fn socket_path(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "nvmf-rpc-hard-{}-{tag}-{}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

fn echo() -> CallFn {
    Arc::new(|_: &str, params: Option<Value>| Ok(params.unwrap_or(Value::Null)))
}

fn serve(path: &PathBuf, opts: ServerOptions) -> Result<ServerHandle, ServeError> {
    serve_unix(path, build_module(&["echo"], echo()), opts)
}

fn am_root() -> bool {
    std::fs::metadata("/proc/self").unwrap().uid() == 0
}

fn read_reply<S: Read>(s: &mut S) -> Value {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    loop {
        let n = s.read(&mut b).expect("reply");
        assert!(
            n > 0,
            "closed before a reply: {:?}",
            String::from_utf8_lossy(&buf)
        );
        if b[0] == b'\n' {
            return serde_json::from_slice(&buf).unwrap();
        }
        buf.push(b[0]);
    }
}

fn assert_closed<S: Read>(s: &mut S) {
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("connection should be closed, got {other:?}"),
    }
}

fn unix(path: &PathBuf) -> UnixStream {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Connects until a request is answered (not refused for lack of a slot), for up to 5 s.
fn wait_for_a_free_slot(path: &PathBuf) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut s = unix(path);
        s.write_all(br#"{"jsonrpc":"2.0","method":"echo","id":7}"#)
            .unwrap();
        let r = read_reply(&mut s);
        if r["id"] == 7 && r.get("result").is_some() {
            return;
        }
        assert!(Instant::now() < deadline, "the slot was never freed: {r}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn socket_is_created_0600_and_0660_for_a_group() {
    let path = socket_path("mode");
    let h = serve(&path, ServerOptions::default()).unwrap();
    let m = std::fs::symlink_metadata(&path).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600);
    // Nothing of the private directory it was bound in is left beside it.
    let dir = path.parent().unwrap();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!(".{name}"))
        })
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    h.shutdown();
    assert!(!path.exists());

    let path = socket_path("group");
    let opts = ServerOptions {
        socket_mode: 0o660,
        socket_group: Some(NOBODY),
        ..Default::default()
    };
    match serve(&path, opts) {
        Ok(h) => {
            let m = std::fs::symlink_metadata(&path).unwrap();
            assert_eq!((m.mode() & 0o7777, m.gid()), (0o660, NOBODY));
            h.shutdown();
        }
        // Without root only our own groups are allowed.
        Err(e) => assert!(!am_root(), "{e}"),
    }
    assert_eq!(nvmf_rpc::group_id("0").unwrap(), 0);
    assert_eq!(nvmf_rpc::group_id("root").unwrap(), 0);
    assert!(matches!(
        nvmf_rpc::group_id("no-such-group-here"),
        Err(ServeError::NoSuchGroup(_))
    ));
}

#[test]
fn another_users_socket_is_refused() {
    use std::os::unix::fs::FileTypeExt;
    // The rule itself, for any metadata.
    let path = socket_path("rule");
    let l = UnixListener::bind(&path).unwrap();
    let ft = std::fs::symlink_metadata(&path).unwrap().file_type();
    assert!(ft.is_socket());
    assert_eq!(judge_existing(ft, 1000, 1000), Existing::OurSocket);
    assert_eq!(
        judge_existing(ft, 1000, 0),
        Existing::NotOurs { owner: 1000 }
    );
    let file_ft = std::fs::metadata("/proc/self/status").unwrap().file_type();
    assert_eq!(judge_existing(file_ft, 0, 0), Existing::NotASocket);
    drop(l);
    std::fs::remove_file(&path).unwrap();

    // The real thing: a stale socket that belongs to nobody (needs root to chown).
    if !am_root() {
        eprintln!("not root: cannot chown a socket to another user; the rule was checked above");
        return;
    }
    let path = socket_path("other");
    drop(UnixListener::bind(&path).unwrap());
    std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
    match serve(&path, ServerOptions::default()) {
        Err(ServeError::NotOurs { owner, us, .. }) => assert_eq!((owner, us), (NOBODY, 0)),
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert_eq!(std::fs::symlink_metadata(&path).unwrap().uid(), NOBODY);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn symlinks_files_and_directories_are_never_replaced() {
    let victim = socket_path("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let link = socket_path("link");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let e = serve(&link, ServerOptions::default()).err().unwrap();
    assert!(matches!(e, ServeError::NotASocket(_)), "{e}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    // A dangling symlink (where an attacker would like our socket created) too.
    let dangling = socket_path("dangling");
    let target = socket_path("target");
    std::os::unix::fs::symlink(&target, &dangling).unwrap();
    assert!(matches!(
        serve(&dangling, ServerOptions::default()),
        Err(ServeError::NotASocket(_))
    ));
    assert!(!target.exists());
    // A regular file.
    let e = serve(&victim, ServerOptions::default()).err().unwrap();
    assert!(matches!(e, ServeError::NotASocket(_)), "{e}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    for p in [&link, &dangling, &victim] {
        std::fs::remove_file(p).unwrap();
    }
}

#[test]
fn live_socket_refused_and_stale_socket_replaced() {
    let path = socket_path("live");
    // Someone else's live server (any listener answers connect()).
    let live = UnixListener::bind(&path).unwrap();
    let e = serve(&path, ServerOptions::default()).err().unwrap();
    assert!(matches!(e, ServeError::InUse(_)), "{e}");
    assert!(path.exists(), "a live socket is left alone");
    // Its process died: the file stays, nobody answers: replaced.
    drop(live);
    let h = serve(&path, ServerOptions::default()).unwrap();
    let mut s = unix(&path);
    s.write_all(br#"{"jsonrpc":"2.0","method":"echo","params":[1],"id":1}"#)
        .unwrap();
    assert_eq!(read_reply(&mut s)["result"], json!([1]));
    // A second server on the same path is refused while this one runs.
    assert!(matches!(
        serve(&path, ServerOptions::default()),
        Err(ServeError::InUse(_))
    ));
    h.shutdown();
    assert!(!path.exists());
}

#[test]
fn shutdown_removes_only_its_own_socket() {
    let path = socket_path("own");
    let h = serve(&path, ServerOptions::default()).unwrap();
    // Somebody replaced the file after we started: not ours to remove.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"theirs").unwrap();
    h.shutdown();
    assert_eq!(std::fs::read(&path).unwrap(), b"theirs");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn idle_clients_are_closed() {
    let path = socket_path("idle");
    let opts = ServerOptions {
        idle_timeout: Duration::from_millis(300),
        ..Default::default()
    };
    assert_eq!(
        ServerOptions::default().idle_timeout,
        Duration::from_secs(60)
    );
    let _h = serve(&path, opts).unwrap();
    // Silent from the start.
    let mut quiet = unix(&path);
    // Half a request, then silence.
    let mut half = unix(&path);
    half.write_all(br#"{"jsonrpc":"2.0","meth"#).unwrap();
    // Busy: keeps talking within the limit.
    let mut busy = unix(&path);
    let started = Instant::now();
    for i in 0..4 {
        std::thread::sleep(Duration::from_millis(150));
        let req = json!({"jsonrpc": "2.0", "method": "echo", "params": [i], "id": i});
        busy.write_all(req.to_string().as_bytes()).unwrap();
        assert_eq!(read_reply(&mut busy)["id"], i);
    }
    assert_closed(&mut quiet);
    assert_closed(&mut half);
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(3), "{waited:?}");
}

/// A client that pipelines requests and never reads a reply: once the socket's buffers are
/// full the server cannot write, and after the idle timeout it closes the connection, so the
/// client's slot comes back (here the only one).
#[test]
fn clients_that_take_no_replies_are_closed() {
    let path = socket_path("noread");
    let opts = ServerOptions {
        idle_timeout: Duration::from_millis(300),
        max_connections: 1,
        ..Default::default()
    };
    let _h = serve(&path, opts).unwrap();
    let mut flooder = unix(&path);
    flooder
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // Echoed 32 KiB parameters fill the reply direction's buffers within a few requests.
    let big = "x".repeat(32 << 10);
    let writer = std::thread::spawn(move || {
        for i in 0..1_000 {
            let req = json!({"jsonrpc": "2.0", "method": "echo", "params": [&big], "id": i});
            if flooder.write_all(req.to_string().as_bytes()).is_err() {
                return i;
            }
        }
        1_000
    });
    wait_for_a_free_slot(&path);
    let sent = writer.join().unwrap();
    assert!(
        sent < 1_000,
        "the server read all {sent} requests without answering"
    );
}

#[test]
fn connection_count_is_bounded() {
    let path = socket_path("count");
    let opts = ServerOptions {
        max_connections: 2,
        ..Default::default()
    };
    assert_eq!(ServerOptions::default().max_connections, 64);
    let _h = serve(&path, opts).unwrap();
    let mut a = unix(&path);
    let mut b = unix(&path);
    // Make sure both are accepted (and hold their slots) before the third arrives.
    for (i, s) in [&mut a, &mut b].into_iter().enumerate() {
        s.write_all(
            json!({"jsonrpc": "2.0", "method": "echo", "id": i})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(read_reply(s)["id"], i);
    }
    let mut c = unix(&path);
    let r = read_reply(&mut c);
    assert_eq!(r["error"]["code"], TOO_MANY_CONNECTIONS);
    assert_closed(&mut c);
    drop(a);
    // The slot comes back once the server sees the hang-up.
    wait_for_a_free_slot(&path);
}

#[test]
fn parse_error_then_the_server_lives_on() {
    let path = socket_path("parse");
    let _h = serve(&path, ServerOptions::default()).unwrap();
    for garbage in [
        &b"\x00\xff\xfe"[..],
        b"{\"a\":]",
        b"]",
        b"nulx",
        b"{\"id\":1,,}",
    ] {
        let mut s = unix(&path);
        s.write_all(garbage).unwrap();
        let r = read_reply(&mut s);
        assert_eq!(r["error"]["code"], RpcError::PARSE_ERROR, "{garbage:?}");
        assert_closed(&mut s);
        let mut t = unix(&path);
        t.write_all(br#"{"jsonrpc":"2.0","method":"echo","params":{"a":1},"id":"x"}"#)
            .unwrap();
        assert_eq!(read_reply(&mut t)["result"], json!({"a": 1}));
    }
}

#[test]
fn truncated_json_at_eof_is_answered_and_closed() {
    let path = socket_path("trunc");
    let _h = serve(&path, ServerOptions::default()).unwrap();
    let mut s = unix(&path);
    s.write_all(br#"{"jsonrpc":"2.0","method":"echo","params":{"a":"#)
        .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(read_reply(&mut s)["error"]["code"], RpcError::PARSE_ERROR);
    assert_closed(&mut s);
    // Whitespace only at EOF is no error.
    let mut s = unix(&path);
    s.write_all(b" \n\t ").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_closed(&mut s);
}

#[test]
fn tcp_is_loopback_only_without_a_token() {
    let module = || build_module(&["echo"], echo());
    for addr in ["0.0.0.0:0", "[::]:0"] {
        match serve_tcp(addr, module(), ServerOptions::default()) {
            Err(ServeError::NotLoopback(a)) => assert!(!a.ip().is_loopback()),
            other => panic!("{addr}: {:?}", other.map(|_| ())),
        }
    }
    let h = serve_tcp("127.0.0.1:0", module(), ServerOptions::default()).unwrap();
    let addr = h.local_addr().unwrap();
    assert!(addr.ip().is_loopback());
    let mut c = Client::connect(&Endpoint::Tcp(addr.to_string()), None).unwrap();
    assert_eq!(c.call("echo", Some(json!([1]))).unwrap(), json!([1]));
}

#[test]
fn opened_tcp_requires_the_token() {
    let secret = "0123456789abcdef-secret";
    let opts = ServerOptions {
        tcp_token: Some(AuthToken::new(secret.as_bytes()).unwrap()),
        ..Default::default()
    };
    let h = serve_tcp("0.0.0.0:0", build_module(&["echo"], echo()), opts).unwrap();
    let addr = format!("127.0.0.1:{}", h.local_addr().unwrap().port());
    let tcp = || {
        let s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    };
    let bad = [
        json!({"jsonrpc": "2.0", "method": "echo", "id": 1}),
        json!({"jsonrpc": "2.0", "method": "echo", "id": 1, "auth_token": "wrong"}),
        json!({"jsonrpc": "2.0", "method": "echo", "id": 1, "auth_token": &secret[..16]}),
        json!({"jsonrpc": "2.0", "method": "echo", "id": 1, "auth_token": format!("{secret}x")}),
        json!({"jsonrpc": "2.0", "method": "echo", "id": 1, "auth_token": 5}),
        // A batch where one request lacks it.
        json!([
            {"jsonrpc": "2.0", "method": "echo", "id": 1, "auth_token": secret},
            {"jsonrpc": "2.0", "method": "echo", "id": 2}
        ]),
    ];
    for req in bad {
        let mut s = tcp();
        s.write_all(req.to_string().as_bytes()).unwrap();
        let r = read_reply(&mut s);
        assert_eq!(r["error"]["code"], UNAUTHORIZED, "{req}");
        assert!(r.get("result").is_none());
        assert_closed(&mut s);
    }
    let mut c = Client::connect(&Endpoint::Tcp(addr.clone()), None).unwrap();
    c.set_auth_token(Some(secret.into()));
    assert_eq!(
        c.call("echo", Some(json!({"a": 1}))).unwrap(),
        json!({"a": 1})
    );
    assert_eq!(c.call("echo", Some(json!([2]))).unwrap(), json!([2]));
    // Errors show the request without the token.
    let mut c = Client::connect(&Endpoint::Tcp(addr), None).unwrap();
    c.set_auth_token(Some("not the token at all".into()));
    match c.call("echo", None) {
        Err(ClientError::Rpc { request, error }) => {
            assert_eq!(error.code, UNAUTHORIZED);
            assert!(request.get("auth_token").is_none());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn token_files_must_be_private_and_long_enough() {
    let dir = std::env::temp_dir().join(format!("nvmf-rpc-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str, mode: u32| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    };
    let good = write("good", "  0123456789abcdef0123\n", 0o600);
    let t = AuthToken::from_file(&good).unwrap();
    assert!(t.matches(b"0123456789abcdef0123"));
    assert!(!t.matches(b"0123456789abcdef012"));
    assert!(!t.matches(b"0123456789abcdef01234"));
    assert!(!t.matches(b"1123456789abcdef0123"));
    assert!(!t.matches(b""));
    assert_eq!(format!("{t:?}"), "AuthToken(..)");
    for (name, text, mode, why) in [
        ("open", "0123456789abcdef0123", 0o644, "chmod 600"),
        ("short", "short", 0o600, "at least 16"),
    ] {
        let p = write(name, text, mode);
        let e = AuthToken::from_file(&p).err().unwrap().to_string();
        assert!(e.contains(why), "{e}");
    }
    assert!(AuthToken::from_file(&dir.join("missing")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn planted_entries_beside_the_path_are_left_alone() {
    let path = socket_path("planted");
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let victim = std::env::temp_dir().join(format!("nvmf-rpc-victim-{}", std::process::id()));
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("keep"), b"keep").unwrap();
    // What an earlier version's temporary directory was called, now a symlink elsewhere.
    let planted = path
        .parent()
        .unwrap()
        .join(format!(".{name}.{}.tmp", std::process::id()));
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let h = serve(&path, ServerOptions::default()).unwrap();
    assert_eq!(std::fs::read(victim.join("keep")).unwrap(), b"keep");
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 1);
    assert!(std::fs::symlink_metadata(&planted)
        .unwrap()
        .file_type()
        .is_symlink());
    h.shutdown();
    std::fs::remove_file(&planted).unwrap();
    std::fs::remove_dir_all(&victim).unwrap();
}
