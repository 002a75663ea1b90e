package e2ee_test

import (
	"context"
	"testing"

	"github.com/mindroomd/mindroomd/e2ee"
	"github.com/mindroomd/mindroomd/testsupport/pg"
)

func TestReplicasOpeningANewCryptoStoreAtOnceAllUpgradeIt(t *testing.T) {
	url := pg.Start(t).Schema(t)
	const replicas = 4
	errs := make(chan error, replicas)
	for range replicas {
		go func() {
			s, err := e2ee.OpenPostgres(context.Background(), url, "")
			if err == nil {
				err = s.Close()
			}
			errs <- err
		}()
	}
	for range replicas {
		if err := <-errs; err != nil {
			t.Fatalf("a replica opening a new crypto store beside others: %v", err)
		}
	}
}
