package sqlitefs

import (
	"testing"

	"github.com/mindroomd/mindroomd/journalsql"
)

func TestEveryStatementOfTheSharedWorkHasSQLiteText(t *testing.T) {
	for s := range journalsql.NumStmts {
		if statements[s] == "" {
			t.Errorf("statement %d has no text", s)
		}
	}
}
