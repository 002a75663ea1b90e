package crash

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"

	"github.com/mindroomd/mindroomd/testsupport/logbuf"
)

// Process is a child run of the test binary, seen from the parent, which
// follows it by the lines it prints on stdout (stdout is unbuffered in
// the child: a line is in the pipe when its write returns, so a line read
// is a step the child finished) and may SIGKILL it at any of them.
type Process struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr logbuf.Buffer
	// Seen is every line read from the child's stdout so far.
	Seen []string
}

// StartProcess runs the test binary with args (a -test.run selecting the
// child's test, say) and env as its whole environment. A child still
// running when the test ends is killed then.
func StartProcess(t *testing.T, env []string, args ...string) *Process {
	t.Helper()
	p := &Process{cmd: exec.Command(os.Args[0], args...), lines: make(chan string, 256)}
	p.cmd.Env = env
	p.cmd.Stderr = &p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("child stdout: %v", err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			p.drain()
			_ = p.cmd.Wait()
		}
	})
	return p
}

// Stderr is what the child wrote on stderr so far (its log).
func (p *Process) Stderr() string { return p.stderr.String() }

// WaitFor reads the child's stdout until a line equals want; the child
// exiting first, or ctx ending, fails the test.
func (p *Process) WaitFor(ctx context.Context, t *testing.T, want string) {
	t.Helper()
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				err := p.cmd.Wait()
				t.Fatalf("child exited (%v) before %q; stdout %q; stderr:\n%s", err, want, p.Seen, p.Stderr())
			}
			p.Seen = append(p.Seen, line)
			if line == want {
				return
			}
		case <-ctx.Done():
			_ = p.cmd.Process.Kill()
			p.drain()
			_ = p.cmd.Wait()
			t.Fatalf("no %q from the child: %v; stdout %q; stderr:\n%s", want, ctx.Err(), p.Seen, p.Stderr())
		}
	}
}

// drain reads the rest of the child's stdout, up to its end.
func (p *Process) drain() {
	for line := range p.lines {
		p.Seen = append(p.Seen, line)
	}
}

// Kill SIGKILLs the child, reaps it, and checks that the signal is what
// ended it.
func (p *Process) Kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill child: %v", err)
	}
	p.drain()
	_ = p.cmd.Wait()
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want killed by SIGKILL; stderr:\n%s", p.cmd.ProcessState, p.Stderr())
	}
}

// Exit waits for the child to finish on its own, successfully.
func (p *Process) Exit(t *testing.T) {
	t.Helper()
	p.drain()
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("child failed: %v; stdout %q; stderr:\n%s", err, p.Seen, p.Stderr())
	}
}
