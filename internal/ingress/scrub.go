package ingress

import (
	"net/http"
	"strings"

	"github.com/sluice-rl/sluice/internal/config"
)

// Headers a client may not send as they are.
//
// Sluice-* headers are Sluice's own (the worker sets Sluice-Job and Sluice-Attempt on each
// delivery): a client's are removed before its request is forwarded or deferred, so the
// upstream never takes a client's word for them. So are their underscore spellings
// (Sluice_Attempt), and the underscore spellings of Idempotency-Key: servers that expose
// headers as CGI variables (HTTP_SLUICE_ATTEMPT, HTTP_IDEMPOTENCY_KEY: Rack, WSGI, PHP, nginx
// with underscores_in_headers) read them as the real one. The client's own Idempotency-Key is
// kept: the worker delivers it on purpose.
//
// The forwarding headers are the ingress's to write for its hop (setForwarding): a client's
// X-Forwarded-For is kept as the chain this hop appends to, its X-Forwarded-Host,
// X-Forwarded-Proto and Forwarded replaced, and its X-Real-IP and True-Client-IP (which
// nginx's realip and Cloudflare set, and upstreams believe as the client's address) dropped,
// as are the underscore spellings of all of them (X_Real_IP reads as HTTP_X_REAL_IP).
//
// A header that spells a key header of a rule or a queue's tenant with underscores instead of
// hyphens (X_API_Key beside X-API-Key) is refused with 400, as a key header repeated with two
// values is: Sluice keys by X-Api-Key, an upstream of that kind may believe X_API_Key, and
// keying by either would let the other buy a fresh key. Refusing is what nginx does by default
// (underscores_in_headers off drops such headers); normalising them into the key header would
// still forward the variant to upstreams that read it differently.

// keyHeaderSet returns the key and tenant header names of rules and queues by their
// spelling-free form (lower case, "_" as "-"), and whether any of them holds an underscore.
func keyHeaderSet(rules []config.Rule, queues []config.Queue) (map[string]string, bool) {
	set := map[string]string{}
	under := false
	add := func(parts []config.KeyPart) {
		for _, p := range parts {
			if p.Kind != config.KeyHeader || p.Name == "" {
				continue
			}
			set[foldHeaderName(p.Name)] = http.CanonicalHeaderKey(p.Name)
			under = under || strings.IndexByte(p.Name, '_') >= 0
		}
	}
	for _, r := range rules {
		add(r.Key)
	}
	for _, q := range queues {
		add(q.Tenant)
	}
	return set, under
}

// foldHeaderName is name in lower case with "_" written as "-": how CGI-style servers see it.
func foldHeaderName(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '_':
			return '-'
		case 'A' <= r && r <= 'Z':
			return r + ('a' - 'A')
		}
		return r
	}, name)
}

// hasPrefixFold reports whether name starts with prefix (lower case, with "-" where name may
// have "-" or "_"), regardless of ASCII case.
func hasPrefixFold(name, prefix string) bool {
	if len(name) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		c := name[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c == '_' {
			c = '-'
		}
		if c != prefix[i] {
			return false
		}
	}
	return true
}

// scheduleHeader reports whether name is one of the headers that schedule or order a job
// submitted to the job API (schedule.go): scrubHeaders keeps them on a submission (POST
// /v1/queues/{q}/jobs), whose headers reach no upstream but its Content-*.
func scheduleHeader(name string) bool {
	return name == hdrDelay || name == hdrNotBefore || name == hdrPriority
}

// scrubHeaders removes from h the headers a client may not send as they are, and returns the
// 400 problem of a request that spells a key header with underscores (nil: none). keys and
// under are the ruleSet's keyHeaders and underscoreKeys; submit says the request submits a
// job to the job API, whose scheduling headers stay.
func scrubHeaders(h http.Header, keys map[string]string, under, submit bool) *Problem {
	for name := range h {
		switch {
		case hasPrefixFold(name, "sluice-"):
			if !submit || !scheduleHeader(name) {
				delete(h, name)
			}
			continue
		case strings.IndexByte(name, '_') < 0 && !under:
			continue // the common case: a hyphenated name, and no key header with "_"
		}
		folded := foldHeaderName(name)
		if folded == "idempotency-key" && name != "Idempotency-Key" {
			delete(h, name)
			continue
		}
		if canon, ok := keys[folded]; ok && name != canon {
			return badRequest("ambiguous rate-limit key",
				"the header "+name+" is another spelling of the key header "+canon+
					", which servers may read as the same header; send "+canon+" only")
		}
		if forwardingHeader(folded) && strings.IndexByte(name, '_') >= 0 {
			delete(h, name)
		}
	}
	return nil
}

// forwardingHeader reports whether folded (foldHeaderName) names a header that tells an
// upstream who the client is or which host it asked for: the ingress writes these itself.
func forwardingHeader(folded string) bool {
	return folded == "forwarded" || folded == "x-real-ip" || folded == "true-client-ip" ||
		strings.HasPrefix(folded, "x-forwarded-")
}
