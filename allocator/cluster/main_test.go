package cluster

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test shuts its nodes down: no raft goroutine may outlive them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
