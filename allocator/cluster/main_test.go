package cluster

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test shuts its nodes down: no raft goroutine may outlive them,
// but for one kind, which Node cannot end: a goroutine waiting on the
// future of an entry raft dropped at shutdown (raft never answers it; see
// Node.wait).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*deferError).Error"))
}
