package pgfs

import (
	"testing"

	"github.com/mindroomd/mindroomd/journalsql"
)

func TestEveryStatementOfTheSharedWorkHasPostgreSQLText(t *testing.T) {
	for s := range journalsql.NumStmts {
		if statements[s] == "" {
			t.Errorf("statement %d has no text", s)
		}
	}
}
