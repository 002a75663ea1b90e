package migration_test

import (
	"testing"
	"testing/fstest"

	"github.com/mindroomd/mindroomd/migration"
)

func TestLoadListsTheFilesInVersionOrder(t *testing.T) {
	fsys := fstest.MapFS{
		"m/0002_more.sql":  {Data: []byte("two")},
		"m/0001_first.sql": {Data: []byte("one")},
	}
	got := migration.Load(fsys, "m")
	if len(got) != 2 || got[0] != (migration.File{Version: 1, Name: "0001_first.sql", SQL: "one"}) ||
		got[1] != (migration.File{Version: 2, Name: "0002_more.sql", SQL: "two"}) {
		t.Fatalf("Load = %+v", got)
	}
}

func TestLoadPanicsOnAGapADuplicateOrAnUnnumberedName(t *testing.T) {
	for name, fsys := range map[string]fstest.MapFS{
		"gap":        {"m/0001_a.sql": {}, "m/0003_c.sql": {}},
		"duplicate":  {"m/0001_a.sql": {}, "m/0001_b.sql": {}},
		"unnumbered": {"m/0001_a.sql": {}, "m/extra.sql": {}},
		"not sql":    {"m/0001_a.sql": {}, "m/0002_b.txt": {}},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("Load accepted the listing")
				}
			}()
			migration.Load(fsys, "m")
		})
	}
}
