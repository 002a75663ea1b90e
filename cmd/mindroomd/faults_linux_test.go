package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// door is a loopback port that refuses connections, as a homeserver that
// is down does, until it opens. Its socket is bound without listening, so
// the kernel refuses each connection and no other process can take the
// port meanwhile.
type door struct {
	fd   int
	addr string
}

// closedDoor binds a loopback port without listening on it.
func closedDoor(t *testing.T) *door {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := &door{fd: fd}
	t.Cleanup(func() {
		if d.fd >= 0 {
			_ = syscall.Close(d.fd)
		}
	})
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	d.addr = fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	return d
}

// open starts listening on the door's port.
func (d *door) open(t *testing.T) net.Listener {
	t.Helper()
	if err := syscall.Listen(d.fd, syscall.SOMAXCONN); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(d.fd), "door")
	d.fd = -1
	defer f.Close()
	l, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// loginRetry is the line the daemon logs for each failed login at start.
const loginRetry = "Homeserver unavailable at start; retrying the login"

// A homeserver that is down when the daemon starts is waited for: the
// login is retried with a growing backoff, through refused connections and
// a 503, and once the server answers the daemon runs and answers. A
// restart while the server is down again, with a session and a sync token
// stored, answers what was said meanwhile, once, and answers nothing
// twice.
func TestAHomeserverDownAtStartIsWaitedForAndNothingSaidMeanwhileIsLost(t *testing.T) {
	hs := dendrite.Start(t)
	bot := hs.Register(t, "echo", "echo-password-2b7d")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	storage := t.TempDir()

	down := closedDoor(t)
	d := runInProcess(writeDaemonConfig(t, "http://"+down.addr, bot, storage))
	defer d.stop(t)
	retries := d.awaitLog(t, loginRetry, 2)
	for i, l := range retries[:2] {
		if l.Failures != i+1 || !strings.Contains(l.Error, "connection refused") {
			t.Fatalf("login retry %d = %+v, want failure %d on a refused connection", i, l, i+1)
		}
	}
	if retries[1].RetryIn < retries[0].RetryIn {
		t.Fatalf("the second retry waits %vms, less than the first's %vms", retries[1].RetryIn, retries[0].RetryIn)
	}
	proxy := newFaultProxy(t, hs.URL)
	proxy.arm(epLogin, fault{status: 503})
	proxy.serve(t, down.open(t))
	daemonAddress(t, d.log)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alice.AwaitEvent(ctx, room, dendrite.Joined(bot.UserID, 1))
	if proxy.count(epLogin) != 1 {
		t.Fatalf("the daemon runs without having met the 503 at login")
	}
	retries = logLines(d.log.String(), loginRetry)
	if last := retries[len(retries)-1]; !strings.Contains(last.Error, "HTTP 503") {
		t.Fatalf("the last login retry = %+v, want the 503", last)
	}
	alice.SendText(room, "hello")
	awaitEchoes(t, alice, room, bot.UserID, "hello")
	if code := d.stop(t); code != exitOK {
		t.Fatalf("the daemon exited %d; its log:\n%s", code, d.log)
	}

	// Down again, with a session and a sync token stored: what is said
	// meanwhile is answered once the server is back.
	down = closedDoor(t)
	d = runInProcess(writeDaemonConfig(t, "http://"+down.addr, bot, storage))
	defer d.stopCleanly(t)
	if l := d.awaitLog(t, loginRetry, 1)[0]; !strings.Contains(l.Error, "check access token") {
		t.Fatalf("the restart's login retry = %+v, want the stored token's check", l)
	}
	alice.SendText(room, "while you were away")
	newFaultProxy(t, hs.URL).serve(t, down.open(t))
	awaitEchoes(t, alice, room, bot.UserID, "while you were away")
	requireEachAnsweredOnce(t, alice, room, bot.UserID, []string{"hello", "while you were away"})
}

// A signal while the daemon waits for its homeserver at start is an
// orderly shutdown: exit 0, and the journal is left for the next start.
func TestASignalWhileWaitingForTheHomeserverAtStartShutsDownInOrder(t *testing.T) {
	down := closedDoor(t)
	storage := t.TempDir()
	d := runInProcess(writeDaemonConfig(t, "http://"+down.addr,
		dendrite.Account{UserID: "@echo:localhost", Password: "never-checked"}, storage))
	d.awaitLog(t, loginRetry, 1)
	if code := d.stop(t); code != exitOK {
		t.Fatalf("the daemon exited %d on a signal while waiting; its log:\n%s", code, d.log)
	}
	if len(logLines(d.log.String(), "Shutting down")) != 1 {
		t.Fatalf("no orderly shutdown was logged:\n%s", d.log)
	}
	if out, err := run(t, "status", "-storage", storage); err != nil || !strings.Contains(out, "echo@@echo:localhost") {
		t.Fatalf("status after the shutdown: %v\n%s", err, out)
	}
}

// A full disk stops the journal's writer: the daemon exits 1 naming the
// fault, with no panic, and a restart once there is room again answers
// every message once, what the stopped daemon had committed and what it
// had not yet taken in alike. The disk fills through a file size limit on
// the daemon's process (RLIMIT_FSIZE), which needs no privilege: the write
// that crosses it is cut short, as on a full disk, and the next one fails.
func TestAFullDiskStopsTheDaemonWithExitCode1AndARestartLosesNothing(t *testing.T) {
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	hs := dendrite.Start(t)
	bot := hs.Register(t, "echo", "echo-password-e61f")
	alice := hs.User(t, hs.Register(t, "alice", "alice-password"))
	room := alice.CreateRoom(bot.UserID)
	storage := t.TempDir()
	cfg := writeDaemonConfig(t, hs.URL, bot, storage)

	p := startDaemonProcess(t, bin, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	alice.AwaitEvent(ctx, room, dendrite.Joined(bot.UserID, 1))
	texts := []string{"before the disk filled"}
	alice.SendText(room, texts[0])
	awaitEchoes(t, alice, room, bot.UserID, texts[0])
	p.stop(t)

	// Room for a few big messages more than the journal holds now.
	var largest int64
	for _, name := range []string{"event_journal.db", "event_journal.db-wal"} {
		if fi, err := os.Stat(filepath.Join(storage, "tracking", name)); err == nil {
			largest = max(largest, fi.Size())
		}
	}
	limit := uint64(largest + 256<<10)
	p = startDaemonProcess(t, bin, cfg)
	if err := unix.Prlimit(p.cmd.Process.Pid, unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: limit, Max: limit}, nil); err != nil {
		t.Fatal(err)
	}
	daemonAddress(t, p.log)
	exited := make(chan error, 1)
	go func() { exited <- p.cmd.Wait() }()
	for i := range 40 {
		text := fmt.Sprintf("big %d %s", i, strings.Repeat("x", 30000))
		alice.SendText(room, text)
		texts = append(texts, text)
	}
	var ended error
	select {
	case ended = <-exited:
	case <-time.After(2 * time.Minute):
		_ = p.cmd.Process.Kill()
		<-exited
		t.Fatalf("the daemon did not stop on the full disk; its log:\n%s", p.log)
	}
	var ee *exec.ExitError
	if !errors.As(ended, &ee) || ee.ExitCode() != exitFailure {
		t.Fatalf("the daemon ended with %v on a full disk, want exit code %d; its log:\n%s", ended, exitFailure, p.log)
	}
	log := p.log.String()
	// Besides its log records, one line: the error, printed once (a panic
	// would print more).
	var words []string
	for _, line := range strings.Split(strings.TrimRight(log, "\n"), "\n") {
		if !strings.HasPrefix(line, "{") {
			words = append(words, line)
		}
	}
	if len(words) != 1 || !strings.HasPrefix(words[0], "mindroomd: journal writer stopped: ") ||
		!(strings.Contains(words[0], "database or disk is full") || strings.Contains(words[0], "disk I/O error")) {
		t.Fatalf("the daemon's words besides its log = %q, want the writer's fault once; its log:\n%s", words, log)
	}
	if len(logLines(log, "Batch failed; stopping the writer"))+len(logLines(log, "Writer failed; stopping")) != 1 {
		t.Fatalf("the writer did not log its stop once; its log:\n%s", log)
	}
	if out, err := run(t, "status", "-storage", storage); err != nil || !strings.Contains(out, "echo@"+bot.UserID) {
		t.Fatalf("status of the journal the full disk stopped: %v\n%s", err, out)
	}

	// Room again.
	p = startDaemonProcess(t, bin, cfg)
	awaitEchoes(t, alice, room, bot.UserID, texts...)
	awaitSettled(t, storage, "echo@"+bot.UserID, len(texts))
	p.stop(t)
	requireEachAnsweredOnce(t, alice, room, bot.UserID, texts)
}

// skipLoudly skips a test the machine cannot run, on stderr as well as in
// the test's output, so a run that skipped it cannot pass unnoticed.
func skipLoudly(t *testing.T, why string) {
	t.Helper()
	msg := fmt.Sprintf("SKIPPED %s: %s; the read-only filesystem fault went untested", t.Name(), why)
	fmt.Fprintln(os.Stderr, msg)
	t.Skip(msg)
}

// A journal on a filesystem that turned read-only (as a disk does after
// I/O errors) stops the start with an error naming the cause and exit
// code 1, and status still reads it, the WAL the killed daemon left
// included. Only root can mount the filesystem; as any other user the
// test cannot run, and chmod is no substitute: the daemon makes its own
// files 0600 again at every start.
func TestAJournalOnAReadOnlyFilesystemStopsTheStartAndStatusStillReadsIt(t *testing.T) {
	if os.Geteuid() != 0 {
		skipLoudly(t, "this machine does not run the tests as root, and only root can mount a filesystem and remount it read-only")
	}
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=16m,mode=0700"); err != nil {
		skipLoudly(t, fmt.Sprintf("root here cannot mount a tmpfs (no CAP_SYS_ADMIN?): %v", err))
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	storage := filepath.Join(mnt, "storage")
	down := closedDoor(t)
	cfg := writeDaemonConfig(t, "http://"+down.addr, dendrite.Account{UserID: "@echo:localhost", Password: "never-checked"}, storage)

	// The daemon opens the journal and registers its principal before it
	// signs in; killed while it waits for the homeserver, it leaves its
	// WAL and shared memory behind.
	p := startDaemonProcess(t, bin, cfg)
	awaitLog(t, p.log, nil, loginRetry, 1)
	p.kill(t)
	for _, name := range []string{"event_journal.db-wal", "event_journal.db-shm"} {
		if _, err := os.Stat(filepath.Join(storage, "tracking", name)); err != nil {
			t.Fatalf("the killed daemon left no %s: %v", name, err)
		}
	}
	if err := unix.Mount("", mnt, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount read-only: %v", err)
	}

	code, _, stderr := mindroomd(t, "run", "-config", cfg)
	if code != exitFailure || strings.Count(stderr, "\n") != 1 ||
		!strings.HasPrefix(stderr, "mindroomd: open journal: ") || !strings.Contains(stderr, "read-only file system") {
		t.Fatalf("run on a read-only journal: exit %d, stderr %q; want exit %d naming the read-only filesystem",
			code, stderr, exitFailure)
	}
	out, err := run(t, "status", "-storage", storage)
	if err != nil || !strings.Contains(out, "echo@@echo:localhost") {
		t.Fatalf("status of the read-only journal: %v\n%s", err, out)
	}
}
