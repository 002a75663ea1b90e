package sqlitefs_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/mindroomd/mindroomd/journal"
	"github.com/mindroomd/mindroomd/sqlitefs"
)

// A damaged file is journal.ErrCorrupt to either open, whichever code
// SQLite gives it, and still fatal to the writer.
func TestADamagedFileIsCorruptToEitherOpen(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{"NotADatabase", func(t *testing.T, path string) {
			if err := os.WriteFile(path, bytes.Repeat([]byte("not a database "), 300), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"SchemaPageOverwritten", func(t *testing.T, path string) {
			db, err := sqlitefs.Open(context.Background(), sqlitefs.Options{StorageDir: filepath.Dir(filepath.Dir(path))})
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			// After the 100-byte header, where the schema table's root
			// page starts; the header still names an SQLite file.
			pageSize := int(b[16])<<8 | int(b[17])
			copy(b[100:pageSize], bytes.Repeat([]byte{0xff}, pageSize-100))
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := sqlitefs.Path(dir)
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, path)
			for _, open := range []struct {
				name string
				open func(context.Context, sqlitefs.Options) (*sqlitefs.DB, error)
			}{{"Open", sqlitefs.Open}, {"OpenReadOnly", sqlitefs.OpenReadOnly}} {
				db, err := open.open(context.Background(), sqlitefs.Options{StorageDir: dir})
				if err == nil {
					_ = db.Close()
					t.Fatalf("%s opened a damaged file", open.name)
				}
				if !errors.Is(err, journal.ErrCorrupt) || !sqlitefs.IsFatal(err) {
					t.Fatalf("%s: %v, want journal.ErrCorrupt over SQLite's fatal code", open.name, err)
				}
			}
		})
	}
}
