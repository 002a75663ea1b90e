package contract

import "testing"

// Run runs every area of the contract against the backend f makes. Each
// subtest gets a fresh, empty backend, so areas can run in any order.
func Run(t *testing.T, f Factory) {
	areas := []struct {
		name string
		run  func(*testing.T, Factory)
	}{
		{"PrincipalIsolation", TestPrincipalIsolation},
		{"Admission", TestAdmission},
		{"Settlement", TestSettlement},
		{"EditReduction", TestEditReduction},
		{"StreamingProgress", TestStreamingProgress},
		{"SidecarPreview", TestSidecarPreview},
		{"Redaction", TestRedaction},
		{"UnreadableRowsDoNotEndTheBacklog", TestUnreadableRowsDoNotEndTheBacklog},
		{"StoreGeneration", TestStoreGeneration},
		{"AdmittedThreadID", TestAdmittedThreadID},
		{"AdmittedEvent", TestAdmittedEvent},
		{"LatestVisibleEvent", TestLatestVisibleEvent},
		{"BadInput", TestBadInput},
		{"Hydration", TestHydration},
		{"AwaitingKeys", TestAwaitingKeys},
		{"RoomList", TestRoomList},
		{"Approvals", TestApprovals},
		{"Retention", TestRetention},
	}
	for _, a := range areas {
		t.Run(a.name, func(t *testing.T) { a.run(t, f) })
	}
}
