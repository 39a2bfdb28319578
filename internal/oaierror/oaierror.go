// Package oaierror writes errors in the OpenAI API's shape,
//
//	{"error": {"message": "...", "type": "...", "param": null, "code": "..."}}
//
// with Content-Type application/json, for the echo engine and the gateway.
// It has no state; every function is safe for concurrent use.
package oaierror

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Error types, as OpenAI names them.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypeNotFound       = "not_found_error"
	TypeServer         = "server_error"
)

// Body is the OpenAI error body.
type Body struct {
	Error Detail `json:"error"`
}

// Detail is the object under "error". Param and Code are null when nil.
type Detail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// Write answers w with status and the error body; param and code may be
// "" for null. It must be called before anything else is written to w.
func Write(w http.ResponseWriter, status int, typ, code, param, msg string) {
	body := Body{Error: Detail{Message: msg, Type: typ}}
	if param != "" {
		body.Error.Param = &param
	}
	if code != "" {
		body.Error.Code = &code
	}
	b, _ := json.Marshal(body) // cannot fail: strings and pointers only
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
