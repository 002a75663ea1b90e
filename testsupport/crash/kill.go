package crash

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
)

// killRound is one child run: how many acknowledgements the parent waited
// for before the SIGKILL, and what it found afterwards.
type killRound struct {
	killAfter      int // acknowledgements read before the kill
	acked          int // acknowledgements read in all, including after the kill
	first, lastAck int // batch numbers acknowledged in this run
	stored         int // batch number of the sync token found after the kill
}

// runAndKill starts the child, SIGKILLs it once killAfter batches were
// acknowledged, reads every acknowledgement it managed to print and waits
// for the journal to be still.
func runAndKill[S journal.Store](ctx context.Context, t *testing.T, j Journal[S], killAfter, wantFirst int) (killRound, error) {
	t.Helper()
	r := killRound{killAfter: killAfter, first: -1, lastAck: -1}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+j.ChildTest+"$")
	cmd.Env = append(os.Environ(), j.Env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return r, err
	}
	if err := cmd.Start(); err != nil {
		return r, fmt.Errorf("start child: %w", err)
	}
	killed := false
	var other []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		nstr, ok := strings.CutPrefix(line, "ACK ")
		if !ok {
			other = append(other, line)
			continue
		}
		n, err := strconv.Atoi(nstr)
		if err != nil {
			other = append(other, line)
			continue
		}
		if want := wantFirst + r.acked; n != want {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return r, fmt.Errorf("child acknowledged batch %d, want %d (resume from the stored token + 1, then consecutive)", n, want)
		}
		if r.first < 0 {
			r.first = n
		}
		r.lastAck = n
		r.acked++
		if r.acked == killAfter && !killed {
			// SIGKILL on Linux: no deferred code, no close, no flush runs.
			if err := cmd.Process.Kill(); err != nil {
				return r, fmt.Errorf("kill child: %w", err)
			}
			killed = true
		}
	}
	// The pipe is at EOF: the child is dead; every ACK it wrote was read.
	waitErr := cmd.Wait()
	if !killed {
		return r, fmt.Errorf("child exited after %d of %d acknowledgements (%v)\nstdout:\n%s\nstderr:\n%s",
			r.acked, killAfter, waitErr, strings.Join(other, "\n"), stderr.String())
	}
	var exitErr *exec.ExitError
	if !errors.As(waitErr, &exitErr) || exitErr.ExitCode() != -1 {
		return r, fmt.Errorf("child wait: got %v, want death by signal", waitErr)
	}
	if j.Quiesce != nil {
		if err := j.Quiesce(ctx); err != nil {
			return r, fmt.Errorf("wait for the killed child's work to end: %w", err)
		}
	}
	if err := ctx.Err(); err != nil {
		return r, fmt.Errorf("crash test deadline: %w", err)
	}
	return r, nil
}

// checkAfterKill reopens the journal and proves the kill lost nothing
// acknowledged and applied no batch in part. It returns the batch number of
// the stored sync token.
func checkAfterKill[S journal.Store](ctx context.Context, j Journal[S], lastAck int) (int, error) {
	s, p, err := openView(ctx, j.Open)
	if err != nil {
		return 0, fmt.Errorf("reopen after kill: %w", err)
	}
	defer s.Close()
	tok, err := p.SyncToken(ctx)
	if err != nil {
		return 0, fmt.Errorf("read sync token: %w", err)
	}
	stored, err := batchOf(tok)
	if err != nil {
		return 0, err
	}
	if stored < lastAck {
		return stored, fmt.Errorf("stored sync token %q is older than the last acknowledged batch %d", tok, lastAck)
	}

	ids, err := j.EventIDs(ctx, s)
	if err != nil {
		return stored, fmt.Errorf("list journal: %w", err)
	}
	perBatch := make(map[int]int)
	for _, id := range ids {
		var b, i int
		if _, err := fmt.Sscanf(id, "$crash-%d-%d", &b, &i); err != nil || id != eventID(b, i) || i >= eventsPerBatch {
			return stored, fmt.Errorf("unexpected event %q in the journal", id)
		}
		perBatch[b]++
	}
	total := len(ids)
	// Every batch up to the stored token is whole (that includes every
	// acknowledged one); none after it has a single event.
	for b := 0; b <= stored; b++ {
		if got := perBatch[b]; got != eventsPerBatch {
			return stored, fmt.Errorf("batch %d: got %d of its %d events (stored token %q, last ack %d)", b, got, eventsPerBatch, tok, lastAck)
		}
	}
	for b, got := range perBatch {
		if b > stored {
			return stored, fmt.Errorf("batch %d: %d events present beyond the stored token %q", b, got, tok)
		}
	}
	if want := (stored + 1) * eventsPerBatch; total != want {
		return stored, fmt.Errorf("journal rows: got %d, want %d", total, want)
	}
	// The conversation, read through the view, holds every journaled
	// message exactly once.
	seen := make(map[string]bool, total)
	for page, err := range journal.Export(ctx, p, room, nil, 500) {
		if err != nil {
			return stored, fmt.Errorf("export: %w", err)
		}
		for _, m := range page.Messages {
			if seen[m.EventID] {
				return stored, fmt.Errorf("message %s read twice", m.EventID)
			}
			seen[m.EventID] = true
		}
	}
	if len(seen) != total {
		return stored, fmt.Errorf("conversation reads %d messages, the journal holds %d", len(seen), total)
	}
	return stored, nil
}
