package store_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/store"
	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

// The crash proof re-executes this test binary as a child that admits sync
// batches and acknowledges each one on stdout only after AdmitBatch
// returned; the parent SIGKILLs it at a random acknowledgement and checks
// the file. These name the child's environment.
const (
	// crashChildDirEnv, when set, makes TestCrashChildProcess the child,
	// admitting into the journal under that storage directory.
	crashChildDirEnv = "MINDROOMD_CRASH_CHILD_DIR"
	// crashSeedEnv replays a logged seed.
	crashSeedEnv = "MINDROOMD_CRASH_SEED"
	// crashWALBufferEnv, set to 1, opens the child's journal with the WAL
	// buffer (Options.WALBuffer).
	crashWALBufferEnv = "MINDROOMD_CRASH_WAL_BUFFER"
)

const (
	crashAgent          = "crash"
	crashUser           = "@crashbot:example.org"
	crashRoom           = "!crash:example.org"
	crashSender         = "@alice:example.org"
	crashEventsPerBatch = 3
	crashMaxAcksPerKill = 200
)

// crashMaxUnmergedTail is the crash journal's page-index tail bound.
const crashMaxUnmergedTail = 7

func crashEventID(batch, i int) string { return fmt.Sprintf("$crash-%d-%d", batch, i) }

func crashToken(batch int) string { return "tok-" + strconv.Itoa(batch) }

// crashBatchOf parses a token written by crashToken; "" (nothing admitted
// yet) is batch -1.
func crashBatchOf(token string) (int, error) {
	if token == "" {
		return -1, nil
	}
	n, err := strconv.Atoi(strings.TrimPrefix(token, "tok-"))
	if err != nil || !strings.HasPrefix(token, "tok-") {
		return 0, fmt.Errorf("sync token %q is not one this test wrote", token)
	}
	return n, nil
}

func openCrashStore(ctx context.Context, dir string, walBuffer bool) (*store.Store, journal.PrincipalStore, error) {
	// A tiny tail bound merges the page index every few batches, so kills
	// also land inside merges and the reopened journal has rows in both.
	s, err := store.Open(ctx, store.Options{StorageDir: dir, Now: func() time.Time { return testsupport.DefaultNow },
		MaxUnmergedTail: crashMaxUnmergedTail, WALBuffer: walBuffer})
	if err != nil {
		return nil, nil, err
	}
	p, err := s.Principal(ctx, crashAgent, crashUser)
	if err != nil {
		_ = s.Close()
		return nil, nil, err
	}
	return s, p, nil
}

// TestCrashChildProcess is the child half of the crash proof; run normally
// it returns at once. As the child it never returns: it admits batches until
// it is killed.
func TestCrashChildProcess(t *testing.T) {
	dir := os.Getenv(crashChildDirEnv)
	if dir == "" {
		return
	}
	ctx := context.Background()
	_, p, err := openCrashStore(ctx, dir, os.Getenv(crashWALBufferEnv) == "1")
	if err != nil {
		t.Fatalf("child: open: %v", err)
	}
	tok, err := p.SyncToken(ctx)
	if err != nil {
		t.Fatalf("child: read sync token: %v", err)
	}
	last, err := crashBatchOf(tok)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	ts := testsupport.DefaultNow.UnixMilli()
	for n := last + 1; ; n++ {
		evs := make([]mx.Ev, crashEventsPerBatch)
		for i := range evs {
			evs[i] = mx.Message(crashEventID(n, i), crashSender, ts, fmt.Sprintf("batch %d event %d", n, i))
		}
		if _, err := p.AdmitBatch(ctx, mx.Live(crashRoom, evs...), crashToken(n)); err != nil {
			t.Fatalf("child: admit batch %d: %v", n, err)
		}
		// os.Stdout is unbuffered: the line is in the pipe when this returns.
		if _, err := fmt.Fprintf(os.Stdout, "ACK %d\n", n); err != nil {
			// The parent is gone.
			os.Exit(2)
		}
	}
}

// killRound is one child run: how many acknowledgements the parent waited
// for before the SIGKILL, and what it found afterwards.
type killRound struct {
	killAfter      int // acknowledgements read before the kill
	acked          int // acknowledgements read in all, including after the kill
	first, lastAck int // batch numbers acknowledged in this run
	stored         int // batch number of the sync token found after the kill
}

// runAndKill starts the child on dir, SIGKILLs it once killAfter batches
// were acknowledged, and reads every acknowledgement it managed to print.
func runAndKill(ctx context.Context, t *testing.T, dir string, walBuffer bool, killAfter, wantFirst int) (killRound, error) {
	t.Helper()
	r := killRound{killAfter: killAfter, first: -1, lastAck: -1}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashChildProcess$")
	cmd.Env = append(os.Environ(), crashChildDirEnv+"="+dir)
	if walBuffer {
		cmd.Env = append(cmd.Env, crashWALBufferEnv+"=1")
	}
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
	if err := ctx.Err(); err != nil {
		return r, fmt.Errorf("crash test deadline: %w", err)
	}
	return r, nil
}

// checkAfterKill reopens the journal and proves the kill lost nothing
// acknowledged and applied no batch in part. It returns the batch number of
// the stored sync token.
func checkAfterKill(ctx context.Context, dir string, walBuffer bool, lastAck int) (int, error) {
	s, p, err := openCrashStore(ctx, dir, walBuffer)
	if err != nil {
		return 0, fmt.Errorf("reopen after kill: %w", err)
	}
	defer s.Close()
	tok, err := p.SyncToken(ctx)
	if err != nil {
		return 0, fmt.Errorf("read sync token: %w", err)
	}
	stored, err := crashBatchOf(tok)
	if err != nil {
		return 0, err
	}
	if stored < lastAck {
		return stored, fmt.Errorf("stored sync token %q is older than the last acknowledged batch %d", tok, lastAck)
	}

	rows, err := s.DB().QueryPool().QueryContext(ctx, `SELECT event_id FROM journal_events`)
	if err != nil {
		return stored, fmt.Errorf("list journal: %w", err)
	}
	defer rows.Close()
	perBatch := make(map[int]int)
	total := 0
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return stored, err
		}
		var b, i int
		if _, err := fmt.Sscanf(id, "$crash-%d-%d", &b, &i); err != nil || id != crashEventID(b, i) || i >= crashEventsPerBatch {
			return stored, fmt.Errorf("unexpected event %q in the journal", id)
		}
		perBatch[b]++
		total++
	}
	if err := rows.Err(); err != nil {
		return stored, err
	}
	// Every batch up to the stored token is whole (that includes every
	// acknowledged one); none after it has a single event.
	for b := 0; b <= stored; b++ {
		if got := perBatch[b]; got != crashEventsPerBatch {
			return stored, fmt.Errorf("batch %d: got %d of its %d events (stored token %q, last ack %d)", b, got, crashEventsPerBatch, tok, lastAck)
		}
	}
	for b, got := range perBatch {
		if b > stored {
			return stored, fmt.Errorf("batch %d: %d events present beyond the stored token %q", b, got, tok)
		}
	}
	if want := (stored + 1) * crashEventsPerBatch; total != want {
		return stored, fmt.Errorf("journal rows: got %d, want %d", total, want)
	}
	// The conversation, read through the page index and its tail, holds
	// every journaled message exactly once.
	seen := make(map[string]bool, total)
	for page, err := range journal.Export(ctx, p, crashRoom, nil, 500) {
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

func TestCrashSIGKILLMidAdmissionLosesNoAcknowledgedBatchAndTearsNone(t *testing.T) {
	if os.Getenv(crashChildDirEnv) != "" {
		return // this process is a child
	}
	kills := 20
	if testing.Short() {
		kills = 5
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(crashSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", crashSeedEnv, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with %s=%d)", seed, crashSeedEnv, seed)
	rng := rand.New(rand.NewPCG(seed, 0x6d696e64726f6f6d))

	// The reopen that checks each kill uses the same VFS as the child, as
	// a restarted daemon would.
	for _, walBuffer := range []bool{false, true} {
		t.Run(fmt.Sprintf("WALBuffer=%v", walBuffer), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			dir := t.TempDir()
			stored := -1
			passed := 0
			for round := 1; round <= kills; round++ {
				killAfter := 1 + rng.IntN(crashMaxAcksPerKill)
				r, err := runAndKill(ctx, t, dir, walBuffer, killAfter, stored+1)
				if err != nil {
					t.Fatalf("kill %d/%d (after %d acks): %v", round, kills, killAfter, err)
				}
				if r.stored, err = checkAfterKill(ctx, dir, walBuffer, r.lastAck); err != nil {
					t.Fatalf("kill %d/%d (after %d acks, acked batches %d..%d): %v", round, kills, killAfter, r.first, r.lastAck, err)
				}
				t.Logf("kill %2d/%d: SIGKILL after ack %3d; acked batches %d..%d (%d); stored token tok-%d (%d committed unacknowledged)",
					round, kills, killAfter, r.first, r.lastAck, r.acked, r.stored, r.stored-r.lastAck)
				stored = r.stored
				passed++
			}
			t.Logf("%d/%d kills passed; %d batches (%d events) durable", passed, kills, stored+1, (stored+1)*crashEventsPerBatch)
		})
	}
}
