#!/bin/sh
echo backing up
