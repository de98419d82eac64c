"""cleaner"""
