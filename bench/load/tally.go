package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/mindroomd/mindroomd/sqlitefs"
	"github.com/mindroomd/mindroomd/store/writer"
)

// lockText matches what SQLite and the writer say about a lock held by
// another connection: the driver's "database is locked" (SQLITE_BUSY) and
// "database table is locked" (SQLITE_LOCKED), and the writer's busy waits
// ("Database busy: ...", "... no longer busy", "... while the database was
// busy", "... still busy ...") and writer.ErrBusy. Returned errors are also
// classified by code (sqlitefs.IsBusy); the text is what a log line offers.
var lockText = regexp.MustCompile(`(?i)database (table )?is locked|sqlite_(busy|locked)|database (still |no longer )?busy|database was busy`)

// maxKept bounds the log lines and errors a report quotes.
const maxKept = 8

// logCapture is the io.Writer every logger of the run writes to. zerolog
// hands it one JSON object per Write; it counts them by level, counts those
// that speak of a lock, and keeps the first few warnings and errors.
type logCapture struct {
	mu      sync.Mutex
	lines   int
	byLevel map[string]int
	locks   int
	kept    []string
}

func newLogCapture() *logCapture { return &logCapture{byLevel: make(map[string]int)} }

// Write implements io.Writer.
func (c *logCapture) Write(p []byte) (int, error) {
	var head struct {
		Level string `json:"level"`
	}
	_ = json.Unmarshal(p, &head) // a line that is not JSON counts under ""
	line := string(bytes.TrimSpace(p))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines++
	c.byLevel[head.Level]++
	locked := lockText.MatchString(line)
	if locked {
		c.locks++
	}
	if (locked || head.Level == "warn" || head.Level == "error" || head.Level == "fatal" || head.Level == "panic") && len(c.kept) < maxKept {
		c.kept = append(c.kept, line)
	}
	return len(p), nil
}

// logSummary is what the capture saw.
type logSummary struct {
	Lines   int
	ByLevel map[string]int
	Locks   int
	Kept    []string
}

func (c *logCapture) summary() logSummary {
	c.mu.Lock()
	defer c.mu.Unlock()
	by := make(map[string]int, len(c.byLevel))
	for k, v := range c.byLevel {
		by[k] = v
	}
	return logSummary{Lines: c.lines, ByLevel: by, Locks: c.locks, Kept: slices.Clone(c.kept)}
}

// errorTally counts every error an operation of the run returned, by
// operation, and those that are lock errors.
type errorTally struct {
	mu    sync.Mutex
	byOp  map[string]int
	locks int
	kept  []string
}

func newErrorTally() *errorTally { return &errorTally{byOp: make(map[string]int)} }

// isLockError reports an error of a lock held elsewhere: by SQLite's code
// (SQLITE_BUSY, SQLITE_LOCKED), as the writer's ErrBusy, or by its text
// when it crossed a boundary that kept only the text.
func isLockError(err error) bool {
	return sqlitefs.IsBusy(err) || errors.Is(err, writer.ErrBusy) || lockText.MatchString(err.Error())
}

// add records err, returned by op. An error caused by the run's own stop
// (its context cancelled) is not a failure and is not counted.
func (t *errorTally) add(ctx context.Context, op string, err error) {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byOp[op]++
	if isLockError(err) {
		t.locks++
	}
	if len(t.kept) < maxKept {
		t.kept = append(t.kept, op+": "+err.Error())
	}
}

// errorSummary is what the tally saw.
type errorSummary struct {
	Total int
	ByOp  map[string]int
	Locks int
	Kept  []string
}

func (t *errorTally) summary() errorSummary {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := errorSummary{ByOp: make(map[string]int, len(t.byOp)), Locks: t.locks, Kept: slices.Clone(t.kept)}
	for k, v := range t.byOp {
		s.ByOp[k] = v
		s.Total += v
	}
	return s
}

// samples collects durations from many goroutines.
type samples struct {
	mu sync.Mutex
	ds []time.Duration
}

func (s *samples) add(d time.Duration) {
	s.mu.Lock()
	s.ds = append(s.ds, d)
	s.mu.Unlock()
}

// spread is a distribution's summary.
type spread struct {
	N             int
	P50, P99, Max time.Duration
}

func (s *samples) spread() spread {
	s.mu.Lock()
	ds := slices.Clone(s.ds)
	s.mu.Unlock()
	if len(ds) == 0 {
		return spread{}
	}
	slices.Sort(ds)
	return spread{N: len(ds), P50: quantile(ds, 0.5), P99: quantile(ds, 0.99), Max: ds[len(ds)-1]}
}

// quantile is the q-quantile of sorted ds (nearest rank), as the
// benchmarks compute it.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// memory is the process's resident set as /proc/self/status gives it, in
// bytes: the peak (VmHWM), and now its anonymous part and the part that is
// mapped files (the journal is read through a memory map).
type memory struct {
	Peak, Anon, File int64
}

// readMemory reads /proc/self/status.
func readMemory() (memory, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return memory{}, err
	}
	defer f.Close()
	var (
		m    memory
		seen int
	)
	fields := map[string]*int64{"VmHWM:": &m.Peak, "RssAnon:": &m.Anon, "RssFile:": &m.File}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := bytes.Cut(sc.Bytes(), []byte(":"))
		dst := fields[string(name)+":"]
		if !ok || dst == nil {
			continue
		}
		kb, ok := bytes.CutSuffix(bytes.TrimSpace(rest), []byte(" kB"))
		if !ok {
			return memory{}, fmt.Errorf("%s: unexpected unit in %q", name, rest)
		}
		n, err := strconv.ParseInt(string(kb), 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("%s: %w", name, err)
		}
		*dst = n * 1024
		seen++
	}
	if err := sc.Err(); err != nil {
		return memory{}, err
	}
	if seen != len(fields) {
		return memory{}, errors.New("VmHWM, RssAnon or RssFile missing from /proc/self/status")
	}
	return m, nil
}

// memorySampler keeps the largest anonymous and mapped-file parts of the
// resident set seen while it runs, so a peak can be told apart: the Go
// heap and SQLite's page caches, or journal pages read through the memory
// map.
type memorySampler struct {
	mu         sync.Mutex
	anon, file int64
	err        error
}

func (m *memorySampler) sample() {
	now, err := readMemory()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.err = err
		return
	}
	m.anon, m.file = max(m.anon, now.Anon), max(m.file, now.File)
}

// run samples every interval until ctx ends, and once more then.
func (m *memorySampler) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		m.sample()
		select {
		case <-ctx.Done():
			m.sample()
			return
		case <-t.C:
		}
	}
}

// peaks returns the largest parts seen.
func (m *memorySampler) peaks() (anon, file int64, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.anon, m.file, m.err
}

// cpuTime returns the user and system CPU time the process has used.
func cpuTime() (user, sys time.Duration, err error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, err
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano()), nil
}
