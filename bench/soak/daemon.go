package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"
)

// stopTimeout bounds the daemon's orderly shutdown, as a service manager
// would (docs/operations.md suggests 90 s).
const stopTimeout = 90 * time.Second

// crashPause is how long the soak waits before restarting a daemon that
// exited by itself, so a daemon that cannot start does not spin.
const crashPause = time.Second

// daemon runs bin/mindroomd on one configuration and storage, one process
// at a time, and restarts it after each kill. Every process appends to the
// same log, behind a line naming its start.
type daemon struct {
	bin, cfg, logPath string
	// onCrash is told of a process that exited without being killed or
	// stopped.
	onCrash func(string)

	mu      sync.Mutex
	cur     *process
	stopped bool
	starts  int
	kills   int
	crashes []string
}

// process is one run of the daemon.
type process struct {
	cmd *exec.Cmd
	n   int
	// started is when the soak started it.
	started time.Time
	done    chan struct{}
	err     error // Wait's error, once done is closed
	// ended says the soak killed or stopped this process, so its exit is
	// no crash.
	ended bool
}

// start runs a new daemon process; d.mu must be held.
func (d *daemon) start() error {
	log, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	// The process holds its own copy of the file.
	defer log.Close()
	d.starts++
	now := time.Now()
	fmt.Fprintf(log, "=== soak: start %d at %s\n", d.starts, now.Format(time.RFC3339Nano))
	cmd := exec.Command(d.bin, "run", "-config", d.cfg)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: an interrupt typed at the soak reaches the
	// soak alone, which then stops the daemon itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", d.bin, err)
	}
	p := &process{cmd: cmd, n: d.starts, started: now, done: make(chan struct{})}
	d.cur = p
	go d.wait(p)
	return nil
}

// wait reaps p; a process that exited by itself is a crash: recorded and,
// unless the soak is stopping, restarted after a pause. done is closed
// before d.mu is taken, so a kill holding d.mu can wait for it.
func (d *daemon) wait(p *process) {
	p.err = p.cmd.Wait()
	close(p.done)
	d.mu.Lock()
	crashed := !p.ended
	if crashed {
		d.crashed(p)
	}
	d.mu.Unlock()
	if !crashed {
		return
	}
	time.Sleep(crashPause)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cur == p && !d.stopped {
		if err := d.start(); err != nil && d.onCrash != nil {
			d.onCrash(fmt.Sprintf("restart after start %d: %v", p.n, err))
		}
	}
}

// crashed records p's exit as a crash; d.mu must be held.
func (d *daemon) crashed(p *process) {
	what := fmt.Sprintf("start %d exited by itself: %v", p.n, p.err)
	d.crashes = append(d.crashes, what)
	if d.onCrash != nil {
		d.onCrash(what)
	}
}

// Start runs the first process.
func (d *daemon) Start() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.start()
}

// KillAndRestart SIGKILLs the running process, waits until it is gone
// (the kernel has then released its journal lock) and starts the next.
func (d *daemon) KillAndRestart() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return errors.New("the daemon is stopped")
	}
	if p := d.cur; p != nil {
		p.ended = true
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("kill: %w", err)
		}
		<-p.done
		d.kills++
		// A process that was gone before the signal exited by itself.
		if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			d.crashed(p)
		}
	}
	return d.start()
}

// Stop asks the running process to shut down in order (SIGTERM) and
// returns its exit error: nil for exit code 0. A process that does not stop
// within stopTimeout is killed, and that is an error.
func (d *daemon) Stop() error {
	d.mu.Lock()
	d.stopped = true
	p := d.cur
	if p != nil {
		p.ended = true
	}
	d.mu.Unlock()
	if p == nil {
		return errors.New("no daemon was started")
	}
	select {
	case <-p.done:
		return fmt.Errorf("start %d had already exited: %v", p.n, p.err)
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal: %w", err)
	}
	select {
	case <-p.done:
		return p.err
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("start %d ignored SIGTERM for %s and was killed", p.n, stopTimeout)
	}
}

// Abort kills whatever runs, for a soak that gives up.
func (d *daemon) Abort() {
	d.mu.Lock()
	d.stopped = true
	p := d.cur
	if p != nil {
		p.ended = true
	}
	d.mu.Unlock()
	if p != nil {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Started is when the running process was started, zero before the
// first.
func (d *daemon) Started() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cur == nil {
		return time.Time{}
	}
	return d.cur.started
}

// Counts reports how many processes started, how many the soak killed, and
// the crashes.
func (d *daemon) Counts() (starts, kills int, crashes []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.starts, d.kills, slices.Clone(d.crashes)
}
