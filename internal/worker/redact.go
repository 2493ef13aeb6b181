package worker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
)

// publicError describes a failed delivery for the job's status, which anyone holding the job
// id can read. It says what went wrong in a fixed vocabulary — a refused connection, a reset,
// an unknown host, a certificate the worker does not trust, a malformed answer — and never
// where or with what: no URL, query string (tokens travel there), userinfo, host, address,
// certificate name or byte of the upstream's answer. The worker logs the whole error (logged).
func publicError(err error) string {
	const prefix = "upstream request failed: "
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	if s := tlsProblem(err); s != "" {
		return prefix + s
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		if dns.IsNotFound {
			return prefix + "lookup: no such host"
		}
		return prefix + "lookup failed"
	}
	var op *net.OpError
	if errors.As(err, &op) {
		var sys *os.SyscallError
		if errors.As(op.Err, &sys) && isOp(op.Op) {
			// The operating system's own words: "connection refused", "connection reset by peer".
			return prefix + op.Op + ": " + sys.Err.Error()
		}
		if isOp(op.Op) {
			return prefix + op.Op + " failed"
		}
		return prefix + "network error"
	}
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return prefix + "the upstream closed the connection"
	case strings.Contains(err.Error(), "malformed HTTP"):
		// net/http quotes the bytes it could not read; they are the upstream's, not ours to show.
		return prefix + "malformed HTTP response"
	}
	return strings.TrimSuffix(prefix, ": ")
}

// tlsProblem names a TLS failure in fixed words, or returns "" for another error. The
// errors' own texts name the certificate's hosts and issuers, which may be internal.
func tlsProblem(err error) string {
	var (
		host    x509.HostnameError
		unknown x509.UnknownAuthorityError
		invalid x509.CertificateInvalidError
		verify  *tls.CertificateVerificationError
		record  tls.RecordHeaderError
		alert   tls.AlertError
	)
	switch {
	case errors.As(err, &host):
		return "tls: the upstream's certificate is not valid for its host"
	case errors.As(err, &unknown):
		return "tls: the upstream's certificate is signed by an unknown authority"
	case errors.As(err, &invalid):
		return "tls: the upstream's certificate is invalid"
	case errors.As(err, &verify):
		return "tls: the upstream's certificate could not be verified"
	case errors.As(err, &record):
		return "tls: the upstream does not speak TLS"
	case errors.As(err, &alert):
		return "tls: handshake refused by the upstream"
	}
	return ""
}

// isOp reports whether op is one of the network operations net names in its errors.
func isOp(op string) bool {
	switch op {
	case "dial", "read", "write", "close", "proxyconnect":
		return true
	}
	return false
}

// logged is err as the worker logs a failed delivery: whole, but for the query string and
// userinfo of the URL, where clients put tokens.
func logged(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	u, perr := url.Parse(ue.URL)
	if perr != nil {
		return &url.Error{Op: ue.Op, URL: "<unparsable URL>", Err: ue.Err}
	}
	u.User = nil
	if u.RawQuery != "" {
		u.RawQuery = "<redacted>"
	}
	return &url.Error{Op: ue.Op, URL: u.String(), Err: ue.Err}
}
