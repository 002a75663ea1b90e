package pgfs

import (
	"testing"

	"github.com/mindroomd/mindroomd/journalsql"
)

func TestEveryStatementOfTheSharedWorkHasPostgreSQLText(t *testing.T) {
	if missing := journalsql.Missing(&statements); len(missing) > 0 {
		t.Fatalf("statements without text: %v", missing)
	}
}
