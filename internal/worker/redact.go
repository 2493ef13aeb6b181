package worker

import (
	"errors"
	"net"
	"net/url"
	"os"
	"regexp"
)

// publicError describes a failed delivery for the job's status, which anyone holding the job
// id can read: it says what went wrong (a refused connection, a reset, an unknown host) but not
// where — no URL, no query string (tokens travel there), no userinfo, no host or address. The
// worker logs the whole error.
func publicError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		if dns.IsNotFound {
			return "upstream request failed: lookup: no such host"
		}
		return "upstream request failed: lookup failed"
	}
	var op *net.OpError
	if errors.As(err, &op) {
		msg := "upstream request failed: " + op.Op
		var sys *os.SyscallError
		if errors.As(op.Err, &sys) {
			return msg + ": " + sys.Err.Error() // "connection refused", "connection reset by peer"
		}
		return msg + ": " + redactText(op.Err.Error())
	}
	return "upstream request failed: " + redactText(err.Error())
}

var (
	urlText  = regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"']*`)
	addrText = regexp.MustCompile(`\[[0-9A-Fa-f:.]+\](:\d+)?|\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b|\b[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+:\d+\b`)
)

// redactText replaces URLs and network addresses in s with placeholders.
func redactText(s string) string {
	s = urlText.ReplaceAllString(s, "<url>")
	return addrText.ReplaceAllString(s, "<address>")
}
