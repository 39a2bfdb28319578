module github.com/rationhq/ration

go 1.26.8

require pgregory.net/rapid v1.3.0

require golang.org/x/time v0.16.0 // indirect
