// Package pg gives tests a real, throwaway PostgreSQL: a cluster made with
// initdb in a temporary directory and started with pg_ctl on a free
// loopback port, or the server MINDROOM_TEST_PG_URL names. Tests take a
// fresh schema (or database) of it each, dropped when the test ends.
//
// A missing server fails the tests: a test that needs PostgreSQL and
// silently skips without one would pass without proving anything.
package pg

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// superuser is the role initdb makes; it logs in without a password
	// (trust), which is safe only because the server takes connections
	// from this machine's loopback alone.
	superuser = "mindroom"
	// defaultDatabase is the database a launched cluster's URL names.
	defaultDatabase = "postgres"
	// serverUser is the OS user the server runs as when the tests run as
	// root, which PostgreSQL refuses.
	serverUser = "postgres"
	// pgctlWait bounds pg_ctl's wait for a start or a stop, in seconds. A
	// cluster starts in well under a second; the margin is for a machine
	// busy with other builds.
	pgctlWait = "60"
	// startAttempts covers the one race a free port has: another process
	// taking it between our probe and the server's bind.
	startAttempts = 3
	// adminTimeout bounds one administrative step (a schema or database
	// made or dropped).
	adminTimeout = 30 * time.Second
	// logTail is how many lines of the server's log a failed run prints.
	logTail = 40
)

// settings go into postgresql.conf after initdb. The server takes TCP on
// 127.0.0.1 only and makes no Unix socket, so nothing but this machine's
// loopback reaches it, and no socket path inside a deep temporary
// directory can pass the kernel's 107-byte limit; pg_ctl -w reads
// readiness from postmaster.pid and needs no socket either. The server's
// messages are in English because the harness reads them (errPortTaken).
const settings = `
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
max_connections = 200
lc_messages = 'C'
`

// fastSettings trade crash safety for speed: a test that kills a client
// loses nothing by them, only a crash of the server or the machine would.
const fastSettings = `
fsync = off
synchronous_commit = off
full_page_writes = off
`

// durableSettings are PostgreSQL's defaults, stated so that the cluster
// is durable whatever initdb's template says.
const durableSettings = `
fsync = on
synchronous_commit = on
full_page_writes = on
`

// errNoServer is the error when no PostgreSQL is at hand.
var errNoServer = errors.New("no PostgreSQL server (initdb, pg_ctl, postgres) on PATH or in /usr/lib/postgresql/*/bin: " +
	"install the Debian package postgresql, or set " + EnvURL + " to a server's postgres:// URL")

// errPortTaken reports a server that lost its port to another process.
var errPortTaken = errors.New("the port was taken")

// Cluster is a PostgreSQL server the tests use: one this package launched,
// or the one MINDROOM_TEST_PG_URL names.
type Cluster struct {
	url string
	// addr is the server's host:port, which unlike url may be printed.
	addr string
	// bins, dataDir and logPath are empty for a server not launched here.
	bins    string
	dataDir string
	logPath string
	// owner runs the server's programs when the tests run as root; nil
	// runs them as the current user.
	owner   *syscall.Credential
	running bool
	seq     atomic.Uint64
}

// Launch makes a cluster in dir, which must exist, and starts it. A
// durable cluster syncs every commit to disk (fsync and synchronous_commit
// on), for a test that crashes the server; otherwise it skips the syncs.
// The caller must call Stop; dir holds the data directory (data) and the
// server's log (postgres.log) and may be removed after. On error the
// server is not running and the error carries the tail of its log.
//
// pg_ctl detaches the server, so a test binary killed before Stop (a
// -timeout panic) leaves it running: `pg_ctl -D DIR/data stop` ends it.
//
// As root, the server runs as the postgres OS user, which must exist; dir
// and the directories above it under the system's temporary directory are
// opened for it to pass through (o+x), and any directory above those must
// already let it.
func Launch(dir string, durable bool) (*Cluster, error) {
	bins, err := binDir()
	if err != nil {
		return nil, err
	}
	owner, err := ownerCredential()
	if err != nil {
		return nil, err
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		return nil, err
	}
	c := &Cluster{bins: bins, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "postgres.log"), owner: owner}
	if err := c.prepare(dir); err != nil {
		return nil, err
	}
	if err := c.initdb(durable); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, c.LogTail(logTail))
	}
	for attempt := 1; ; attempt++ {
		err = c.start()
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == startAttempts {
			return nil, fmt.Errorf("%w\n%s", err, c.LogTail(logTail))
		}
	}
}

// binDir finds the directory holding initdb, pg_ctl and postgres: the one
// PATH's initdb is in, else the newest /usr/lib/postgresql/VERSION/bin
// (where Debian's packages put them, off PATH).
func binDir() (string, error) {
	var dirs []string
	if p, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	versions, err := filepath.Glob("/usr/lib/postgresql/*/bin")
	if err != nil {
		return "", err
	}
	slices.SortFunc(versions, func(a, b string) int {
		return compareVersions(filepath.Base(filepath.Dir(b)), filepath.Base(filepath.Dir(a)))
	})
	for _, dir := range append(dirs, versions...) {
		if hasServer(dir) {
			return dir, nil
		}
	}
	return "", errNoServer
}

// hasServer tells whether dir holds all three programs, executable.
func hasServer(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := exec.LookPath(filepath.Join(dir, name)); err != nil {
			return false
		}
	}
	return true
}

// compareVersions orders PostgreSQL version directories numerically by
// their dotted parts ("9.6" before "15"); a part that is not a number
// counts as 0.
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(pa), len(pb)) {
		var na, nb int
		if i < len(pa) {
			na, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			nb, _ = strconv.Atoi(pb[i])
		}
		if na != nb {
			return na - nb
		}
	}
	return 0
}

// ownerCredential is the postgres OS user's when the tests run as root,
// nil otherwise.
func ownerCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(serverUser)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL refuses to run as root, and there is no %s user to run it as: %w", serverUser, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("%s user's uid: %w", serverUser, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("%s user's gid: %w", serverUser, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// prepare makes the data directory and the log file in dir, the server's
// user's.
func (c *Cluster) prepare(dir string) error {
	if c.owner != nil {
		if err := c.openPath(dir); err != nil {
			return err
		}
	}
	if err := os.Mkdir(c.dataDir, 0o700); err != nil {
		return err
	}
	log, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if err := log.Close(); err != nil {
		return err
	}
	if c.owner == nil {
		return nil
	}
	for _, p := range []string{c.dataDir, c.logPath} {
		if err := os.Chown(p, int(c.owner.Uid), int(c.owner.Gid)); err != nil {
			return err
		}
	}
	return nil
}

// openPath lets the server's user pass through dir and every directory
// above it. os.MkdirTemp and t.TempDir make their directories 0700, so
// those under the system's temporary directory are given o+x and g+x
// (searching, not listing); any other directory on the way must already
// let the user through, as /tmp itself does.
func (c *Cluster) openPath(dir string) error {
	tmp, err := filepath.EvalSymlinks(os.TempDir())
	if err != nil {
		return err
	}
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if !c.canSearch(fi) {
			if !strings.HasPrefix(p, tmp+string(filepath.Separator)) {
				return fmt.Errorf("the %s user cannot pass through %s; launch the cluster under %s", serverUser, p, tmp)
			}
			if err := os.Chmod(p, fi.Mode().Perm()|0o011); err != nil {
				return err
			}
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// canSearch tells whether the server's user may pass through the
// directory fi describes. Its supplementary groups are not counted: the
// server runs without them.
func (c *Cluster) canSearch(fi os.FileInfo) bool {
	perm := fi.Mode().Perm()
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case ok && st.Uid == c.owner.Uid:
		return perm&0o100 != 0
	case ok && st.Gid == c.owner.Gid:
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// initdb makes the cluster and writes the test settings into its
// postgresql.conf.
func (c *Cluster) initdb(durable bool) error {
	if err := c.run("initdb", "-D", c.dataDir, "-A", "trust", "-U", superuser,
		"-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return fmt.Errorf("initdb: %w", err)
	}
	conf, err := os.OpenFile(filepath.Join(c.dataDir, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	extra := fastSettings
	if durable {
		extra = durableSettings
	}
	if _, err := io.WriteString(conf, settings+extra); err != nil {
		conf.Close()
		return fmt.Errorf("write postgresql.conf: %w", err)
	}
	return conf.Close()
}

// start runs the server on a free port and waits until it takes
// connections.
func (c *Cluster) start() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	before, err := os.Stat(c.logPath)
	if err != nil {
		return err
	}
	if err := c.run("pg_ctl", "start", "-D", c.dataDir, "-l", c.logPath, "-w", "-t", pgctlWait,
		"-o", "-p "+strconv.Itoa(port)); err != nil {
		if strings.Contains(c.logSince(before.Size()), "Address already in use") {
			return fmt.Errorf("start postgres on port %d: %w", port, errPortTaken)
		}
		return fmt.Errorf("start postgres: %w", err)
	}
	c.running = true
	c.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c.url = "postgres://" + superuser + "@" + c.addr + "/" + defaultDatabase + "?sslmode=disable"
	return nil
}

// Stop shuts the server down (a fast shutdown: sessions are ended, the
// last commits kept), waiting until it has exited; one that does not stop
// in time is shut down immediately and the error says so. Stopping a
// stopped cluster, or a server this package did not launch, does nothing.
func (c *Cluster) Stop() error {
	if !c.running {
		return nil
	}
	err := c.run("pg_ctl", "stop", "-D", c.dataDir, "-m", "fast", "-w", "-t", pgctlWait)
	if err == nil {
		c.running = false
		return nil
	}
	if err2 := c.run("pg_ctl", "stop", "-D", c.dataDir, "-m", "immediate", "-w", "-t", pgctlWait); err2 != nil {
		return fmt.Errorf("stop postgres: %w; immediate stop: %w", err, err2)
	}
	c.running = false
	return fmt.Errorf("stop postgres: %w (stopped immediately instead)", err)
}

// run runs one of the server's programs as the server's user, with its
// output appended to the log. Variables PG* are dropped from its
// environment, so the caller's PGDATA or PGPORT cannot redirect it, and
// LC_* give way to LC_ALL=C, so its messages are in English.
func (c *Cluster) run(name string, args ...string) error {
	log, err := os.OpenFile(c.logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(filepath.Join(c.bins, name), args...)
	// The server's user may not be able to enter the test's working
	// directory; it can enter the data directory's parent.
	cmd.Dir = filepath.Dir(c.dataDir)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = []string{"LC_ALL=C"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "LC_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if c.owner != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.owner}
	}
	return cmd.Run()
}

// URL is an administrator's (superuser's, for a launched cluster) URL of
// the cluster's default database. It may hold a password: never log it.
func (c *Cluster) URL() string {
	return c.url
}

// Addr is the server's host:port, which may be printed.
func (c *Cluster) Addr() string {
	return c.addr
}

// LogTail returns the last n lines of the server's log (which also holds
// initdb's and pg_ctl's output).
func (c *Cluster) LogTail(n int) string {
	if c.logPath == "" {
		return "(no log: the server at " + c.addr + " was not launched here)"
	}
	data, err := os.ReadFile(c.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// logSince returns the log from byte offset off on.
func (c *Cluster) logSince(off int64) string {
	data, err := os.ReadFile(c.logPath)
	if err != nil || off > int64(len(data)) {
		return ""
	}
	return string(data[off:])
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
