"""Records each JSON-RPC request a client sends over a Unix socket, one JSON line each, and
answers plausibly (enough for rpc.py save_config): record-server.py SOCKET OUT.jsonl"""
import json, os, socket, sys, threading
path, out = sys.argv[1], sys.argv[2]
try: os.unlink(path)
except FileNotFoundError: pass
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); srv.bind(path); srv.listen(8)
log = open(out, "a")
def reply(req):
    m = req.get("method")
    if m == "framework_get_subsystems":
        return [{"subsystem": "bdev", "depends_on": []}, {"subsystem": "nvmf", "depends_on": ["bdev"]}]
    if m == "framework_get_config": return []
    if m in ("bdev_get_bdevs", "nvmf_get_subsystems"): return []
    if m.endswith("_create") and m.startswith("bdev_"): return req["params"].get("name", "x")
    return True
def serve(c):
    buf = b""; dec = json.JSONDecoder()
    while True:
        d = c.recv(65536)
        if not d: return
        buf += d
        try: req, end = dec.raw_decode(buf.decode())
        except ValueError: continue
        buf = buf[end:]
        log.write(json.dumps(req) + "\n"); log.flush()
        c.sendall(json.dumps({"jsonrpc": "2.0", "id": req.get("id"), "result": reply(req)}).encode())
while True:
    c, _ = srv.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
