package main

import (
	"fmt"

	"github.com/rationhq/ration"
)

// credentials are the bearer tokens of each role (docs/security.md): a
// role's list is empty when it is open (-no-auth), absent (admin and peer
// outside a cluster) or replaced by mutual TLS (peer with -cluster-ca and
// no -peer-token-file).
type credentials struct {
	gateway []string // the lease API
	admin   []string // membership, backup, restore
	peer    []string // raft
}

// readCredentials reads the token files of cfg and refuses a token found
// in the files of two roles, naming the files (never the token): a secret
// shared by two roles would let the holder of one act as the other.
func readCredentials(cfg config) (credentials, error) {
	var c credentials
	roles := []struct {
		flag, path string
		tokens     *[]string
	}{
		{"-token-file", cfg.tokenFile, &c.gateway},
		{"-admin-token-file", cfg.adminTokenFile, &c.admin},
		{"-peer-token-file", cfg.peerTokenFile, &c.peer},
	}
	owner := map[string]int{} // token -> the role that holds it
	for i, r := range roles {
		if r.path == "" {
			continue
		}
		tokens, err := ration.ReadTokenFile(r.path)
		if err != nil {
			return c, fmt.Errorf("%s: %w", r.flag, err)
		}
		for _, t := range tokens {
			if j, ok := owner[t]; ok && j != i {
				return c, fmt.Errorf("%s (%s) and %s (%s) hold the same token: each role needs tokens of its own", roles[j].flag, roles[j].path, r.flag, r.path)
			}
			owner[t] = i
		}
		*r.tokens = tokens
	}
	return c, nil
}
