package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"

	"github.com/rationhq/ration"
)

// spenderID is instance i's (from 0) spender id at the allocator:
// prefix-(i+1).
func spenderID(prefix string, i int) string { return prefix + "-" + strconv.Itoa(i+1) }

// defaultSpenderPrefix is the spender id prefix when -spender-id is not
// given: gateway-demo/HOST/PID/RANDOM, unique per process, so separate
// demo processes on one allocator never share a spender id (which would
// move each other to new epochs). The host name is cut so that every
// instance's id fits ration.MaxSpenderIDLen.
func defaultSpenderPrefix() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	tail := fmt.Sprintf("/%d/%08x", os.Getpid(), rand.Uint32())
	room := ration.MaxSpenderIDLen - len("gateway-demo/") - len(tail) - len(spenderID("", maxInstances-1))
	host = strings.ToValidUTF8(host, "?")
	if len(host) > room {
		host = strings.ToValidUTF8(host[:room], "?") // a cut rune becomes one shorter "?"
	}
	return "gateway-demo/" + host + tail
}
