package e2ee_test

import (
	"os"
	"testing"

	"github.com/mindroomd/mindroomd/testsupport/dendrite"
)

// hs is the Dendrite the package's tests share; each test registers
// accounts of its own.
var hs *dendrite.Server

func TestMain(m *testing.M) { os.Exit(dendrite.RunTests(m, func(s *dendrite.Server) { hs = s })) }
