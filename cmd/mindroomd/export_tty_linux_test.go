//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mindroomd/mindroomd/api"
)

// openTerminal opens a pseudo-terminal: tty to hand a program as its
// stderr, and the controller side, from which the test reads what the
// program drew.
func openTerminal(t *testing.T) (controller, tty *os.File) {
	t.Helper()
	controller, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open a pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { _ = controller.Close() })
	if err := unix.IoctlSetPointerInt(int(controller.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock the pseudo-terminal: %v", err)
	}
	n, err := unix.IoctlGetUint32(int(controller.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("name the pseudo-terminal: %v", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open the terminal side: %v", err)
	}
	t.Cleanup(func() { _ = tty.Close() })
	return controller, tty
}

// exportOnTerminal runs the real binary's export with its stderr on a
// terminal and its stdout on a pipe, and returns both.
func exportOnTerminal(t *testing.T, args ...string) (stdout, drawn string) {
	t.Helper()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	controller, tty := openTerminal(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"export"}, args...)...)
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, tty
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The controller reads until the terminal side is closed everywhere:
	// in the child when it exits, here right after.
	read := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(controller) // ends with EIO once the terminal side is gone
		read <- b
	}()
	err = cmd.Wait()
	_ = tty.Close()
	if err != nil {
		t.Fatalf("mindroomd export on a terminal: %v\n%s", err, <-read)
	}
	return out.String(), string(<-read)
}

// With stderr on a terminal, export draws its progress there, and clears
// it: the export on stdout is the same as without.
func TestExportDrawsProgressOnATerminalOnly(t *testing.T) {
	storage, srv := exportFixture(t, api.DefaultExportPage)
	cfg := exportConfig(t, storage, "127.0.0.1:8787", "helper")
	want := apiExport(t, srv.URL, "helper", exportRoom, "format=jsonl")
	for _, tc := range []struct {
		name  string
		args  []string
		drawn string
	}{
		{"ThroughTheAPI", []string{"-api", srv.URL}, "export"},
		{"Offline", []string{"-offline"}, "export: writing pages"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-config", cfg, "-room", exportRoom}, tc.args...)
			stdout, drawn := exportOnTerminal(t, args...)
			if stdout != string(want) {
				t.Fatalf("export on stdout:\n%s\nwant:\n%s", stdout, want)
			}
			if !strings.Contains(drawn, tc.drawn) {
				t.Fatalf("the terminal shows %q, want progress (%q)", drawn, tc.drawn)
			}
			// The bar is cleared: the last thing drawn is blank.
			if last := drawn[strings.LastIndex(drawn, "\r"):]; strings.TrimSpace(last) != "" {
				t.Fatalf("the terminal ends with %q, not a cleared line", last)
			}
			code, piped, stderr := mindroomd(t, append([]string{"export"}, args...)...)
			if code != exitOK || piped != stdout || stderr != "" {
				t.Fatalf("into a pipe: exit %d, stderr %q, same export: %v; want exit 0 and no progress", code, stderr, piped == stdout)
			}
		})
	}
}
