// Package memberurl compares an allocator member's URL with a URL a
// server names (a NOT_LEADER leader, a redirect's Location), so that a
// client sends its bearer token only to members it was given.
package memberurl

import (
	"net"
	"net/url"
	"strings"
)

// Key is the form in which member URLs are compared: scheme, lower-case
// host, port (the scheme's default when absent) and path without a
// trailing slash. It has no user information, so it can name the member
// in logs and metrics.
func Key(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return u.Scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port) + strings.TrimSuffix(u.EscapedPath(), "/")
}
