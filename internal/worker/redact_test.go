package worker

import (
	"context"
	"net/http"
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
	if got := redactText(`Post "https://a.example:8443/p?x=1": proxy 10.1.2.3:3128 and [fe80::1]:80 and db.internal:5432`); strings.ContainsAny(got, "0123456789") {
		t.Errorf("redactText left addresses: %q", got)
	}
}
