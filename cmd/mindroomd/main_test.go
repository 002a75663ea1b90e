package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/mindroomd/mindroomd/testsupport"
	"github.com/mindroomd/mindroomd/testsupport/mx"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	m := NewMain(&out)
	ctx := context.Background()
	if err := m.ParseFlags(ctx, args); err != nil {
		return out.String(), err
	}
	err := m.Run(ctx)
	if cerr := m.Close(); err == nil {
		err = cerr
	}
	return out.String(), err
}

func TestStatusSummarisesEachPrincipal(t *testing.T) {
	s, dir := testsupport.MustOpen(t)
	ctx := context.Background()
	v, err := s.Principal(ctx, "helper", "@helper:example.org")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.AdmitBatch(ctx, mx.Live("!r:example.org",
		mx.Message("$a", "@alice:example.org", 1000, "hi"),
		mx.Notice("$b", "@alice:example.org", 1001, "fyi")), "tok"); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "status", "-storage", dir)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if !strings.Contains(out, "helper@@helper:example.org  2       1        2        0") {
		t.Fatalf("status output:\n%s", out)
	}
}

func TestStatusRefusesAMissingJournal(t *testing.T) {
	if out, err := run(t, "status", "-storage", t.TempDir()); err == nil || !strings.Contains(err.Error(), "no journal") {
		t.Fatalf("err=%v out=%s, want a missing-journal error", err, out)
	}
}

func TestAnUnknownCommandIsAnError(t *testing.T) {
	if _, err := run(t, "frobnicate"); err == nil {
		t.Fatal("unknown command accepted")
	}
}
