// Command replay answers every request with one recorded HTTP response (status, headers and
// body, as `curl -si` prints it), through net/http. scripts/bench-peers.sh runs it with the
// ingress's own 429: what a plain Go server pays for the same bytes, beside what the ingress
// pays to decide and write them.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:19320", "address to serve on")
	file := flag.String("response", "", "the recorded response (`curl -si` output)")
	set := flag.String("set", "", "headers to set besides the recorded ones, as `Name: value; Name: value`")
	flag.Parse()
	raw, err := os.ReadFile(*file)
	if err != nil {
		log.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	if err != nil {
		log.Fatalf("%s: %v", *file, err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		log.Fatalf("%s: %v", *file, err)
	}
	resp.Header.Del("Date")           // net/http writes its own
	resp.Header.Del("Content-Length") // net/http writes it for a body it holds whole, as for the ingress
	for _, kv := range strings.Split(*set, ";") {
		if k, v, ok := strings.Cut(kv, ":"); ok {
			resp.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
		}
	}
	status := resp.StatusCode
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		// Values are assigned, as the ingress does, not appended: a copy of the map's slices
		// would be work the ingress does not do.
		dst := w.Header()
		for k, v := range resp.Header {
			dst[k] = v
		}
		w.WriteHeader(status)
		w.Write(body)
	})
	srv := &http.Server{Addr: *listen, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
