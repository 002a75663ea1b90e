package e2ee

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAPickleKeyIsGeneratedOnceSecretAndReadBackTheSame(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "pickle.key")
	first, err := LoadPickleKey(path)
	if err != nil {
		t.Fatalf("first start: %v", err)
	}
	if len(first) < 32 {
		t.Fatalf("generated key of %d bytes, want at least 32", len(first))
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want it written 0600", fi, err)
	}
	again, err := LoadPickleKey(path)
	if err != nil || string(again) != string(first) {
		t.Fatalf("second start read %q, %v; want the generated key back", again, err)
	}
}

func TestAnEmptyPickleKeyFileIsAnErrorNotAKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pickle.key")
	if err := os.WriteFile(path, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadPickleKey(path)
	if err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("LoadPickleKey of an empty file = %v, want an error saying it is empty", err)
	}
}

func TestAPickleKeyIsTheFilesTextWithoutItsSurroundingSpace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pickle.key")
	if err := os.WriteFile(path, []byte("  my own key\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadPickleKey(path)
	if err != nil || string(got) != "my own key" {
		t.Fatalf("LoadPickleKey = %q, %v; want %q", got, err, "my own key")
	}
}
