"""locust"""
