// Package openapitest holds the servers to their OpenAPI documents (internal/openapi) in
// tests: a Validator is an http.RoundTripper that checks every request a test sends to a
// registered listener, and every answer it gets, against the listener's document, with
// github.com/getkin/kin-openapi (openapi3filter.ValidateRequest and ValidateResponse, JSON
// Schema 2020-12 as OpenAPI 3.1 asks).
//
// The model: a test package installs one Validator for http.DefaultClient in its TestMain
// ([Install]), registers each listener it starts under the document it serves ([Validator.Serve]:
// "job" for listen, "admin" for admin_listen), and ends with [Validator.Finish]. Install
// sets the Transport of http.DefaultClient; a client of a test's own can use the Validator as
// its Transport. Requests to
// other hosts (upstreams, test servers) and to paths no document describes (the requests the
// ingress forwards) pass untouched.
//
// What fails: an answer that does not match its operation (an undocumented status, a missing
// required header, a body off its schema), and a request off the document that was not
// answered with a 4xx (a test may send a malformed request on purpose: the server must then
// refuse it). RoundTrip then returns an error naming the operation, the status and the reason,
// so the test's request fails; Finish lists every failure again and fails the package. A
// validated exchange counts the operation as exercised: Finish, asked to, fails the package
// when a full run left an operation of a document unexercised.
//
// Costs: a validated exchange's bodies are read into memory, the request's before it is sent
// and the answer's before the test sees it, so a streamed body arrives at once when it ends (a
// test of a stalled body must not send it through a Validator); the documents are parsed once,
// by New. Keep benchmarks off it.
package openapitest

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/sluice-rl/sluice/internal/openapi"
)

// A spec is one loaded document.
type spec struct {
	name   string
	raw    []byte
	router routers.Router
}

// Validator is a validating http.RoundTripper; see the package doc. It is safe for
// concurrent use.
type Validator struct {
	next  http.RoundTripper
	specs map[string]*spec

	mu       sync.Mutex
	hosts    map[string]*spec           // host:port → the document it serves
	covered  map[string]map[string]bool // document → "METHOD /path" exercised
	checked  int                        // exchanges validated
	failures []string
}

// New returns a Validator that sends through next (nil: a clone of http.DefaultTransport)
// and knows the documents "job" (openapi.Job) and "admin" (openapi.Admin). It fails when a
// document does not load or is not a valid OpenAPI document.
func New(next http.RoundTripper) (*Validator, error) {
	if next == nil {
		next = http.DefaultTransport.(*http.Transport).Clone()
	}
	for _, ct := range []string{"text/html", "text/javascript", "application/openmetrics-text"} {
		if openapi3filter.RegisteredBodyDecoder(ct) == nil {
			openapi3filter.RegisterBodyDecoder(ct, openapi3filter.PlainBodyDecoder) // read as a string
		}
	}
	v := &Validator{next: next, specs: map[string]*spec{}, hosts: map[string]*spec{}, covered: map[string]map[string]bool{}}
	for name, raw := range map[string][]byte{"job": openapi.Job(), "admin": openapi.Admin()} {
		s, err := load(name, raw)
		if err != nil {
			return nil, err
		}
		v.specs[name] = s
		v.covered[name] = map[string]bool{}
	}
	return v, nil
}

func load(name string, raw []byte) (*spec, error) {
	ctx := context.Background()
	doc, err := openapi3.NewLoader().LoadFromData(raw)
	if err != nil {
		return nil, fmt.Errorf("openapitest: load %s: %w", name, err)
	}
	if err := doc.Validate(ctx); err != nil {
		return nil, fmt.Errorf("openapitest: %s is not a valid OpenAPI document: %w", name, err)
	}
	doc.Servers = nil // match any host: the tests' listeners are on free ports
	r, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("openapitest: route %s: %w", name, err)
	}
	return &spec{name: name, raw: raw, router: r}, nil
}

// Install makes a Validator the Transport of http.DefaultClient, so that http.Get, http.Post
// and http.DefaultClient.Do go through it (http.DefaultTransport itself is left alone: the
// processes under test clone it). It panics when the documents do not load: a TestMain has no
// test to fail.
func Install() *Validator {
	v, err := New(nil)
	if err != nil {
		panic(err)
	}
	http.DefaultClient.Transport = v
	return v
}

// Serve registers the listener at hostport ("127.0.0.1:8080") as serving document ("job" or
// "admin") until the test ends.
func (v *Validator) Serve(t testing.TB, document, hostport string) {
	t.Helper()
	s, ok := v.specs[document]
	if !ok {
		t.Fatalf("openapitest: no document %q", document)
	}
	v.mu.Lock()
	v.hosts[hostport] = s
	v.mu.Unlock()
	t.Cleanup(func() {
		v.mu.Lock()
		defer v.mu.Unlock()
		if v.hosts[hostport] == s {
			delete(v.hosts, hostport)
		}
	})
}

// RoundTrip sends req through the next transport, validating it and its answer when req is
// for a registered listener and an operation of its document.
func (v *Validator) RoundTrip(req *http.Request) (*http.Response, error) {
	v.mu.Lock()
	s := v.hosts[req.URL.Host]
	v.mu.Unlock()
	if s == nil {
		return v.next.RoundTrip(req)
	}
	return v.exchange(s, req, v.next)
}

// Handler returns a transport that serves each request with h in-process, no listener in
// between, validating the exchange against document ("job" or "admin") as RoundTrip does for
// a registered listener. The request is passed to h as it is: build it with
// httptest.NewRequest to give h a server's view (RemoteAddr, Host). It panics for an unknown
// document.
func (v *Validator) Handler(document string, h http.Handler) http.RoundTripper {
	s := v.specs[document]
	if s == nil {
		panic("openapitest: no document " + document)
	}
	serve := transport(func(r *http.Request) (*http.Response, error) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Result(), nil
	})
	return transport(func(r *http.Request) (*http.Response, error) { return v.exchange(s, r, serve) })
}

// transport is a function as an http.RoundTripper.
type transport func(*http.Request) (*http.Response, error)

func (f transport) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// exchange sends req through next and validates it and its answer against s, when req is for
// an operation of s.
func (v *Validator) exchange(s *spec, req *http.Request, next http.RoundTripper) (*http.Response, error) {
	route, params, err := s.router.FindRoute(req)
	if err != nil {
		return next.RoundTrip(req) // not the document's: forwarded, or an unknown path
	}
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		req.Body.Close()
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	vreq := req.Clone(context.Background())
	vreq.Body = io.NopCloser(bytes.NewReader(body))
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true}}
	reqErr := openapi3filter.ValidateRequest(context.Background(), in)

	resp, err := next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(data))
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode,
		Header: resp.Header, Options: in.Options}
	out.SetBodyBytes(data)
	op := req.Method + " " + route.Path
	v.mu.Lock()
	v.checked++
	v.mu.Unlock()
	var why string
	switch respErr := openapi3filter.ValidateResponse(context.Background(), out); {
	case respErr != nil:
		why = "answer off the document: " + oneLine(respErr)
	case reqErr != nil && (resp.StatusCode < 400 || resp.StatusCode > 499):
		why = "request off the document (" + oneLine(reqErr) + ") was not refused with a 4xx"
	case reqErr == nil:
		v.mu.Lock()
		v.covered[s.name][op] = true
		v.mu.Unlock()
	}
	if why == "" {
		return resp, nil
	}
	msg := fmt.Sprintf("openapi %s: %s %s → %d: %s", s.name, req.Method, req.URL.RequestURI(), resp.StatusCode, why)
	v.mu.Lock()
	v.failures = append(v.failures, msg)
	v.mu.Unlock()
	return nil, fmt.Errorf("%s", msg)
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// Failures returns every validation failure so far.
func (v *Validator) Failures() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.failures)
}

// Unexercised returns the operations of document ("METHOD /path") that no validated exchange
// has exercised so far.
func (v *Validator) Unexercised(document string) []string {
	s := v.specs[document]
	if s == nil {
		return []string{"no document " + document}
	}
	ops, err := openapi.Operations(s.raw)
	if err != nil {
		return []string{err.Error()}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []string
	for _, op := range ops {
		if !v.covered[document][op] {
			out = append(out, op)
		}
	}
	return out
}

// Finish is the end of a TestMain: it returns code (m.Run's), or 1 when a validation failed
// or, on a full run of the package (no -run or -skip), an operation of one of the documents
// cover was never exercised; it prints what failed.
func (v *Validator) Finish(code int, cover ...string) int {
	if testing.Verbose() {
		v.mu.Lock()
		fmt.Printf("openapi: %d exchanges validated, %d failed\n", v.checked, len(v.failures))
		v.mu.Unlock()
	}
	for _, f := range v.Failures() {
		fmt.Fprintln(os.Stderr, "FAIL:", f)
		code = 1
	}
	if code != 0 || !fullRun() {
		return code
	}
	for _, d := range cover {
		if missing := v.Unexercised(d); len(missing) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: openapi %s: operations no test exercised with a valid request: %s\n", d, strings.Join(missing, ", "))
			code = 1
		}
	}
	return code
}

// fullRun reports whether every test of the package was asked for.
func fullRun() bool {
	for _, name := range []string{"test.run", "test.skip"} {
		if f := flag.Lookup(name); f != nil && f.Value.String() != "" {
			return false
		}
	}
	return true
}
