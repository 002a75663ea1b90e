package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
	"github.com/mindroomd/mindroomd/testsupport/e2eeperson"
)

// BenchmarkIdleRSSEncrypted measures the resident memory of the daemon's
// binary, idle with one agent in an encrypted room. The binary is built
// as make build builds bin/mindroomd (the version stamp aside), here, so
// the smoke run needs no build before it, and run as its own process.
// Before it starts, a person (e2eeperson) creates an encrypted room and
// invites the agent; the daemon's first sync takes the invite and joins,
// the person sends one message and awaits the agent's answer, decrypted,
// so the agent holds an olm session, the person's megolm session and one
// of its own. Then the daemon is left alone until it is idle (idleQuiet
// with almost no CPU), and its VmRSS, RssAnon and RssFile are read from
// /proc/PID/status.
//
// A binary fresh from the linker is measured beside a copy of it: on this
// ext4 the page cache holds a freshly linked file in 2 MiB folios, which
// the kernel maps whole with PMD entries (FilePmdMapped), so the process
// counts 2 MiB in RssFile for each such folio it touches; the copy, written
// by the kernel's copy path, is cached in small folios and counted by the
// page. Each iteration runs both, in alternating order, each with a new
// agent account and storage, so each is a first start.
//
// Metrics: built-rss-MiB (VmRSS), built-anon-MiB, built-file-MiB,
// built-pmd-MiB (FilePmdMapped, from /proc/PID/smaps_rollup) and the same
// for copy-, the medians over the iterations.
func BenchmarkIdleRSSEncrypted(b *testing.B) {
	hs := dendrite.Start(b)
	alice := e2eeperson.New(b, hs, hs.Register(b, "alice", "alice-password"))
	dir := b.TempDir()
	built := filepath.Join(dir, "mindroomd")
	cmd := exec.Command("go", "build", "-o", built, "github.com/mindroomd/mindroomd/cmd/mindroomd")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	copied := filepath.Join(dir, "mindroomd-copy")
	if err := copyFile(built, copied, false); err != nil {
		b.Fatal(err)
	}
	if err := os.Chmod(copied, 0o700); err != nil {
		b.Fatal(err)
	}

	runs := 0
	measure := func(bin string) procMemory {
		runs++
		acct := hs.Register(b, "agent"+strconv.Itoa(runs), "agent-password")
		room := alice.CreateEncryptedRoom(acct.UserID)
		d := startDaemon(b, bin, hs.URL, acct)
		defer d.stop(b)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		alice.AwaitDecrypted(ctx, room, joinOf(acct.UserID))
		alice.SendText(room, "hello")
		alice.AwaitDecrypted(ctx, room, encryptedEcho(acct.UserID, "hello"))
		if err := awaitIdle(d.cmd.Process.Pid, time.Minute); err != nil {
			b.Fatal(err)
		}
		m, err := readProcMemory(d.cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		return m
	}
	var builtMem, copyMem []procMemory
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			builtMem = append(builtMem, measure(built))
			copyMem = append(copyMem, measure(copied))
		} else {
			copyMem = append(copyMem, measure(copied))
			builtMem = append(builtMem, measure(built))
		}
	}
	b.StopTimer()
	report := func(prefix string, ms []procMemory) {
		med := func(f func(procMemory) int64) float64 {
			xs := make([]float64, len(ms))
			for i, m := range ms {
				xs[i] = mib(f(m))
			}
			return median(xs)
		}
		b.ReportMetric(med(func(m procMemory) int64 { return m.rss }), prefix+"-rss-MiB")
		b.ReportMetric(med(func(m procMemory) int64 { return m.anon }), prefix+"-anon-MiB")
		b.ReportMetric(med(func(m procMemory) int64 { return m.file }), prefix+"-file-MiB")
		b.ReportMetric(med(func(m procMemory) int64 { return m.pmd }), prefix+"-pmd-MiB")
	}
	report("built", builtMem)
	report("copy", copyMem)
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// daemonProc is one run of the daemon's binary.
type daemonProc struct {
	cmd  *exec.Cmd
	done chan error
	log  string
}

// startDaemon runs bin with one echo agent signed in as acct, auto-joining
// its invites, its storage and log in a directory of its own.
func startDaemon(b *testing.B, bin, homeserver string, acct dendrite.Account) *daemonProc {
	b.Helper()
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte(acct.Password), 0o600); err != nil {
		b.Fatal(err)
	}
	cfg := filepath.Join(dir, "mindroom.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`homeserver: %s
storage: ./storage
listen: 127.0.0.1:0
agents:
  - name: echo
    user_id: "%s"
    password_file: pw
    auto_join: true
    backend:
      type: echo
`, homeserver, acct.UserID)), 0o600); err != nil {
		b.Fatal(err)
	}
	logPath := filepath.Join(dir, "daemon.log")
	log, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(bin, "run", "-config", cfg)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	d := &daemonProc{cmd: cmd, done: make(chan error, 1), log: logPath}
	go func() { d.done <- cmd.Wait() }()
	return d
}

// stop ends the daemon in order (SIGTERM), killing it if it has not
// stopped within a minute, and fails the benchmark unless it exited
// cleanly.
func (d *daemonProc) stop(b *testing.B) {
	b.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		b.Fatal(err)
	}
	select {
	case err := <-d.done:
		if err != nil {
			log, _ := os.ReadFile(d.log)
			b.Fatalf("the daemon exited with %v; its log:\n%s", err, log)
		}
	case <-time.After(time.Minute):
		_ = d.cmd.Process.Kill()
		<-d.done
		b.Fatal("the daemon did not stop within a minute of SIGTERM")
	}
}

// procMemory is a process's resident memory, in bytes: all of it, its
// anonymous and file-backed parts, and the file-backed part mapped in
// 2 MiB pieces.
type procMemory struct{ rss, anon, file, pmd int64 }

// readProcMemory reads VmRSS, RssAnon and RssFile from /proc/PID/status
// and FilePmdMapped from /proc/PID/smaps_rollup.
func readProcMemory(pid int) (procMemory, error) {
	var m procMemory
	if err := readKB(fmt.Sprintf("/proc/%d/status", pid), map[string]*int64{"VmRSS:": &m.rss, "RssAnon:": &m.anon, "RssFile:": &m.file}); err != nil {
		return procMemory{}, err
	}
	if err := readKB(fmt.Sprintf("/proc/%d/smaps_rollup", pid), map[string]*int64{"FilePmdMapped:": &m.pmd}); err != nil {
		return procMemory{}, err
	}
	return m, nil
}

// readKB sets each field named in fields from the "Name: N kB" lines of
// the file at path, and fails if one is missing.
func readKB(path string, fields map[string]*int64) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[2] == "kB" && fields[f[0]] != nil {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			*fields[f[0]] = kb << 10
			delete(fields, f[0])
		}
	}
	if len(fields) > 0 {
		return fmt.Errorf("%s: no %s line", path, strings.Join(slices.Sorted(maps.Keys(fields)), " or "))
	}
	return sc.Err()
}

// The daemon is idle once it has used at most idleCPU of CPU time over
// the last idleQuiet, sampled every idleSample. An answered daemon waits in
// its sync's long poll; a minute's samples after the answer showed its RSS
// steady from the first second on, and a forced GC two minutes later
// moved it by less than 1 MiB.
const (
	idleQuiet  = 2 * time.Second
	idleCPU    = 10 * time.Millisecond
	idleSample = 100 * time.Millisecond
)

// awaitIdle waits until the process pid is idle, for at most timeout.
func awaitIdle(pid int, timeout time.Duration) error {
	type sample struct {
		at  time.Time
		cpu time.Duration
	}
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(idleSample)
	defer tick.Stop()
	var window []sample
	for {
		cpu, err := procCPU(pid)
		if err != nil {
			return err
		}
		now := time.Now()
		window = append(window, sample{at: now, cpu: cpu})
		// The window keeps the newest sample at least idleQuiet old.
		for len(window) > 1 && now.Sub(window[1].at) >= idleQuiet {
			window = window[1:]
		}
		if now.Sub(window[0].at) >= idleQuiet && cpu-window[0].cpu <= idleCPU {
			return nil
		}
		if now.After(deadline) {
			return fmt.Errorf("the daemon was not idle within %s: %s of CPU in the last %s", timeout, cpu-window[0].cpu, now.Sub(window[0].at))
		}
		<-tick.C
	}
}

// procCPU is the CPU time a process has used (utime + stime).
func procCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; the fields after it are plain.
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return 0, errors.New("malformed /proc/PID/stat")
	}
	f := strings.Fields(string(data[end+1:]))
	// utime and stime are fields 14 and 15 of stat, 12 and 13 after the name.
	if len(f) < 13 {
		return 0, errors.New("short /proc/PID/stat")
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	// Linux reports in USER_HZ, 100 on every architecture Go supports.
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}
