package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
)

// api is a client of the admin API at base.
type api struct {
	base  *url.URL
	token string
	hc    *http.Client // nil: http.DefaultClient
}

// maxResponse bounds what the CLI reads of one answer.
const maxResponse = 16 << 20

// call sends method path with body as JSON (nil: no body), decodes a 2xx answer into out (when
// not nil) and returns its raw bytes. A non-2xx answer is an error that says the status and the
// problem's title and detail, in one line.
func (a *api) call(ctx context.Context, method, path string, body, out any) ([]byte, error) {
	// path's segments are escaped by the caller; the base may carry a path prefix of its own.
	target := strings.TrimSuffix(a.base.String(), "/") + path
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	hc := a.hc
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, unwrapURLError(err))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return nil, fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: %s", method, path, problemLine(resp, raw))
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return nil, fmt.Errorf("%s %s: the answer is not the expected JSON: %w", method, path, err)
		}
	}
	return raw, nil
}

func unwrapURLError(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

// problemLine describes a failed answer in one line: "404 Unknown queue: no queue named "x"".
func problemLine(resp *http.Response, raw []byte) string {
	line := resp.Status
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	var p struct {
		Title  string `json:"title"`
		Detail string `json:"detail"`
	}
	if (mt == "application/problem+json" || mt == "application/json") && json.Unmarshal(raw, &p) == nil {
		switch {
		case p.Title != "" && p.Detail != "":
			line = fmt.Sprintf("%d %s: %s", resp.StatusCode, p.Title, p.Detail)
		case p.Title != "":
			line = fmt.Sprintf("%d %s", resp.StatusCode, p.Title)
		}
	}
	if resp.StatusCode == http.StatusUnauthorized {
		line += " (set --token or SLUICE_ADMIN_TOKEN)"
	}
	return strings.Join(strings.Fields(line), " ")
}
