package worker

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestPublicErrorRedacts makes real failed requests and checks that what the job status would
// show names the failure but no URL, query, userinfo or address.
func TestPublicErrorRedacts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, target := range []string{
		"http://user:pa55@127.0.0.1:1/internal/billing?token=s3cr3t", // connection refused
		"http://billing.invalid:8443/x?token=s3cr3t",                 // no such host
		"http://[::1]:1/internal?token=s3cr3t",
	} {
		req, err := http.NewRequestWithContext(ctx, "POST", target, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s: request succeeded", target)
		}
		got := publicError(err)
		for _, leak := range []string{"s3cr3t", "token", "pa55", "user", "127.0.0.1", "billing", "internal", "::1", ":1"} {
			if strings.Contains(got, leak) {
				t.Errorf("%s: status error %q leaks %q (from %q)", target, got, leak, err)
			}
		}
		if !strings.HasPrefix(got, "upstream request failed: ") {
			t.Errorf("%s: status error %q does not say what failed", target, got)
		}
	}
}

// A TLS failure names neither the certificate's hosts nor its issuer, and a malformed answer
// shows none of the upstream's bytes: the status says what failed in fixed words.
func TestPublicErrorTLSAndMalformed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tlsUp := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	tlsUp.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are the point
	tlsUp.StartTLS()
	defer tlsUp.Close()
	port := tlsUp.URL[strings.LastIndex(tlsUp.URL, ":")+1:]
	trusting := tlsUp.Client() // trusts the test certificate, valid for example.com and 127.0.0.1

	garbage, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer garbage.Close()
	go func() {
		for {
			c, err := garbage.Accept()
			if err != nil {
				return
			}
			go func() {
				// Answer once the request is in (a TLS hello or an HTTP request), as a server
				// that speaks something else does.
				buf := make([]byte, 4096)
				c.Read(buf)
				c.Write([]byte("SSH-2.0-OpenSSH internal-db-01.corp\r\n\r\n"))
				c.Close()
			}()
		}
	}()

	for _, tc := range []struct {
		name, url string
		client    *http.Client
		want      string
	}{
		{"unknown authority", tlsUp.URL + "/?token=s3cr3t", http.DefaultClient, "upstream request failed: tls: the upstream's certificate is signed by an unknown authority"},
		{"wrong host", "https://localhost:" + port + "/", trusting, "upstream request failed: tls: the upstream's certificate is not valid for its host"},
		{"not TLS", "https://" + garbage.Addr().String() + "/", http.DefaultClient, "upstream request failed: tls: the upstream does not speak TLS"},
		{"malformed", "http://" + garbage.Addr().String() + "/", http.DefaultClient, "upstream request failed: malformed HTTP response"},
	} {
		req, _ := http.NewRequestWithContext(ctx, "GET", tc.url, nil)
		resp, err := tc.client.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s: request succeeded", tc.name)
		}
		if got := publicError(err); got != tc.want {
			t.Errorf("%s: publicError = %q, want %q (from %q)", tc.name, got, tc.want, err)
		}
		for _, leak := range []string{"example.com", "localhost", "internal-db", "corp", "OpenSSH", "s3cr3t"} {
			if strings.Contains(publicError(err), leak) {
				t.Errorf("%s: %q leaks %q", tc.name, publicError(err), leak)
			}
		}
	}
}

// The log keeps a failed delivery's error, host and path, but not its query or userinfo.
func TestLoggedDropsQueryAndUserinfo(t *testing.T) {
	err := &url.Error{Op: "Post", URL: "https://bob:pa55@billing.internal:8443/charge?api_key=s3cr3t&x=1",
		Err: errors.New("connection refused")}
	got := logged(err).Error()
	for _, leak := range []string{"s3cr3t", "api_key", "pa55", "bob"} {
		if strings.Contains(got, leak) {
			t.Errorf("logged = %q, leaks %q", got, leak)
		}
	}
	for _, keep := range []string{"billing.internal:8443/charge", "connection refused"} {
		if !strings.Contains(got, keep) {
			t.Errorf("logged = %q, want it to keep %q", got, keep)
		}
	}
}
