package store_test

import (
	"testing"

	"github.com/mindroomd/mindroomd/contract"
)

// TestDeliveryContract runs the delivery, turn-record and membership-fence
// areas of the contract against the SQLite store.
func TestDeliveryContract(t *testing.T) { contract.RunDelivery(t, sqliteFactory) }

func TestDeliveryContractWithEveryRowMergedIntoThePageIndex(t *testing.T) {
	contract.RunDelivery(t, mergingFactory(1))
}

func TestDeliveryContractWithTheWALBuffer(t *testing.T) {
	contract.RunDelivery(t, walBufferFactory)
}
