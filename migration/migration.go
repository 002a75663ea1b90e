// Package migration lists a store's schema migrations: numbered SQL files
// embedded in the binary, which the store owning them applies in order,
// each in one transaction with its version bump; and it decides, for
// either store, whether a database found on opening is one this binary
// may use (Check), with the errors that refuse one.
package migration

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// File is one migration.
type File struct {
	// Version is the schema version the migration brings the database to.
	Version int
	// Name is the file's name, for errors.
	Name string
	// SQL is the file's text, as embedded.
	SQL string
}

// Load lists the files of dir in fsys in version order. Their names are
// NNNN_description.sql, numbered from 1 without a gap: anything else is a
// mistake of the build, and panics.
func Load(fsys fs.FS, dir string) []File {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		panic(err)
	}
	var files []File
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || !strings.HasSuffix(e.Name(), ".sql") {
			panic("migration without a numbered .sql name: " + e.Name())
		}
		body, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			panic(err)
		}
		files = append(files, File{Version: v, Name: e.Name(), SQL: string(body)})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Version < files[j].Version })
	for i, f := range files {
		if f.Version != i+1 {
			panic(fmt.Sprintf("migration %s out of sequence", f.Name))
		}
	}
	return files
}
