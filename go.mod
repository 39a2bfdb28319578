module github.com/rationhq/ration

go 1.26.8
