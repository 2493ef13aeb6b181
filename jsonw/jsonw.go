// Package jsonw writes JSON by hand on hot paths, byte for byte as encoding/json's Marshal would,
// without reflection or allocation. It is a leaf: it imports only the standard library.
//
// It is public because the public queue package (the job envelope it stores in JetStream) and
// the ingress (problem bodies of 429s) both use it, and a public package may not import an
// internal one. Its API is one function, AppendString; it is safe for concurrent use.
package jsonw

import "unicode/utf8"

// AppendString appends s as a JSON string, escaped as encoding/json escapes it: '"',
// '\\' and control characters; '<', '>' and '&' as \u003c, \u003e, \u0026; U+2028 and
// U+2029; and each byte of invalid UTF-8 as \ufffd.
func AppendString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[c&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
